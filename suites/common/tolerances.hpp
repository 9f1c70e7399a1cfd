// Every error bound the conformance tests use, in one place, each with its reason.
// OPS-1 compares an op against its float64 reference by normalised mean squared
// error, NMSE = sum (a - b)^2 / sum b^2 (anchor: ggml test-backend-ops, 1e-7 for
// most ops, 5e-4 for matrix products). 16-bit storage sets a floor: one
// round-to-nearest store has relative error up to 2^-11 (fp16) or 2^-8 (bf16),
// so NMSE up to (2^-11)^2 ~ 2.4e-7 and (2^-8)^2 ~ 1.5e-5 from that store alone.
#pragma once

#include "harness/dtype.hpp"

namespace hr::tol {

// How an op's result is formed, which sets how much error it may carry.
enum class OpClass {
  elementwise,   // each output is one fp32 expression of its inputs, stored once
  reduction,     // an output sums many fp32 terms (norms, softmax, losses), stored once
  matmul,        // long dot products (cuBLAS / BLAS), stored once
  optimizer,     // several update steps, the parameter stored after each
};

struct Bound {
  double nmse;
  const char* reason;
};

inline constexpr double kFp16Store = 1.0 / (2048.0 * 2048.0);  // (2^-11)^2: one fp16 store
inline constexpr double kBf16Store = 1.0 / (256.0 * 256.0);     // (2^-8)^2: one bf16 store

inline Bound nmse_bound(OpClass c, DType t) {
  switch (c) {
    case OpClass::elementwise:
      if (t == DType::f16) return {2 * kFp16Store, "one fp16 store: (2^-11)^2 worst case, x2 for the fp32 math before it"};
      if (t == DType::bf16) return {2 * kBf16Store, "one bf16 store: (2^-8)^2 worst case, x2 for the fp32 math before it"};
      return {1e-12, "fp32 math, a few ulp per element (libm tanhf/expf): NMSE ~1e-14; "
                     "far inside ggml's 1e-7 so a wrong formula cannot hide"};
    case OpClass::reduction:
      if (t == DType::f16) return {4 * kFp16Store, "one fp16 store of a value summed in fp32; x4 for the sums"};
      if (t == DType::bf16) return {4 * kBf16Store, "one bf16 store of a value summed in fp32; x4 for the sums"};
      return {1e-10, "fp32 sums over up to ~1e6 terms: relative error ~sqrt(n) * 2^-24 squared; inside ggml's 1e-7"};
    case OpClass::matmul:
      if (t == DType::f32) return {1e-7, "ggml test-backend-ops' default bound, fp32 products accumulated in fp32"};
      return {5e-4, "ggml test-backend-ops' bound for matrix products with 16-bit inputs"};
    case OpClass::optimizer:
      if (t == DType::f16) return {16 * kFp16Store, "the parameter is rounded to fp16 after each of several steps"};
      if (t == DType::bf16) return {16 * kBf16Store, "the parameter is rounded to bf16 after each of several steps"};
      return {1e-11, "several fp32 steps (sqrt, division): a few ulp of the update each step"};
  }
  return {0.0, "unknown op class"};
}

// OPS-2: backward against float64 central finite differences of the reference
// forward. Step h on inputs of order 1: truncation h^2 |f'''| / 6 ~ 1e-11 and
// cancellation 2^-52 / h ~ 1e-11 in double, both far below any dtype bound, so the
// op's backward is held to the same NMSE bound as its forward.
inline constexpr double kFiniteDifferenceStep = 1e-5;

// Dropout keep fraction: |kept/n - (1-p)| within this many binomial standard
// deviations sqrt(p (1-p) / n); 5 sigma fails a correct generator ~6e-7 of the time.
inline constexpr double kBinomialSigmas = 5.0;

}  // namespace hr::tol
