// Every numerical bound the test suites assert, in one place, each with its reason.
// Op bounds are normalised mean squared errors, NMSE = sum (a - b)^2 / sum b^2,
// of a result against its float64 reference (the anchor: ggml test-backend-ops,
// 1e-7 for most ops, 5e-4 for matrix products).
#pragma once

#include "harness/dtype.hpp"

namespace hr::tol {

// A bound per storage dtype.
struct PerDType {
  double f32, f16, bf16;
  constexpr double operator()(DType t) const {
    return t == DType::f16 ? f16 : t == DType::bf16 ? bf16 : f32;
  }
};

// Row-wise ops (layernorm, batchnorm, softmax, embedding, cross-entropy), forward
// and backward. The reference is fed the same (already rounded) inputs, so what
// remains is fp32 arithmetic plus one rounding of each stored output:
// - fp32: anchor ggml's 1e-7; fp32 accumulation over rows of up to 50304 values
//   measures ~1e-13, so the bound has wide headroom and still fails on any wrong
//   term (a missing mask or a wrong normaliser moves NMSE to >= 1e-4).
// - fp16: rounding a value to 11 significant bits has a mean squared relative
//   error of u^2 / 3 with u = 2^-11, about 8e-8; 1e-6 leaves ~12x for the outputs
//   that go through a second stored tensor (probabilities, then their gradient).
// - bf16: the same with u = 2^-8 gives 5.1e-6; 5e-5 leaves ~10x.
inline constexpr PerDType kRowwiseNmse{1e-7, 1e-6, 5e-5};

// Backward passes against float64 central finite differences of the reference
// forward (OPS-2). Finite differences with h = 1e-6 in double are accurate to
// ~1e-9 relative, far below these; the bound is the dtype's storage error as above,
// with 4x for the two stored tensors a gradient passes through (inputs and dy).
inline constexpr PerDType kRowwiseGradNmse{1e-7, 4e-6, 2e-4};

// Element-wise ops (add, scale, axpy, cast, add_bias, GELU, dropout), forward and
// backward: each output is one fp32 expression of its inputs, stored once.
// - fp32: a few ulp per element (tanhf in GELU) gives NMSE ~1e-14; 1e-12 keeps
//   100x headroom and is far inside ggml's 1e-7, so a wrong constant cannot hide.
// - fp16 / bf16: one round-to-nearest store has relative error at most u = 2^-11
//   (2^-8), so NMSE <= u^2 = 2.4e-7 (1.5e-5) from the store alone; 2 u^2 leaves
//   room for the fp32 math before it. Measured: ~7e-8 and ~5e-6.
inline constexpr PerDType kElementwiseNmse{1e-12, 2.0 / (2048.0 * 2048.0), 2.0 / (256.0 * 256.0)};

// Sums stored once (bias gradient columns, reduce::sum / squared_norm): fp32
// accumulation of up to ~1e6 terms, relative error ~sqrt(n) 2^-24, squared ~1e-11;
// 16-bit results as for row-wise ops.
inline constexpr PerDType kSumNmse{1e-10, 1e-6, 5e-5};

// Optimizer steps against a float64 reference of several steps (SGD, AdamW):
// fp32 parameters carry a few ulp per step (sqrt, division), ~1e-14 measured;
// a 16-bit parameter is rounded once per step, so k steps allow up to k u^2
// (u = 2^-11 or 2^-8); the tests run 5 steps and the bound allows 16 u^2.
inline constexpr PerDType kOptimizerNmse{1e-11, 16.0 / (2048.0 * 2048.0), 16.0 / (256.0 * 256.0)};

// Dropout keep fraction: |kept/n - (1-p)| within this many binomial standard
// deviations sqrt(p (1-p) / n); 5 sigma fails a correct generator ~6e-7 of the time.
inline constexpr double kBinomialSigmas = 5.0;

// Central finite-difference step for element-wise backward passes (OPS-2) in
// double: truncation h^2 |f'''| / 6 ~ 1e-11 and cancellation 2^-52 / h ~ 1e-11,
// both far below kElementwiseNmse, so a backward is held to its forward's bound.
inline constexpr double kElementwiseFdStep = 1e-5;

}  // namespace hr::tol
