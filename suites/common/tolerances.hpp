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

}  // namespace hr::tol
