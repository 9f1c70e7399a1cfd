// Every tolerance the suites assert with, in one place, each with its reason.
// Norm-wise measures (NMSE, relative L2) per storage dtype; the reference sees the
// same rounded inputs as the op, so a bound covers the op's own rounding only.
#pragma once

#include "harness/dtype.hpp"

namespace hr::tol {

// ---- OPS-1: matrix products (matmul, matmul_batched, linear) against float64 ----
// NMSE. Anchor: ggml test-backend-ops bounds matrix products by 5e-4 NMSE; ours are
// tighter per dtype because accumulation is fp32 everywhere (no TF32, no reduced-
// precision reductions): fp32 rounding over K <= 4096 terms is ~sqrt(K) 2^-24
// relative (NMSE ~1e-12, bound 1e-9 leaves room for any summation order); fp16 and
// bf16 add one rounding of the output (2^-11 resp. 2^-8 relative, NMSE ~1e-7 resp.
// ~5e-6), bounded at ~10x that and never looser than the anchor.
inline double matmul_nmse(DType t) {
  switch (t) {
    case DType::f16: return 1e-6;
    case DType::bf16: return 5e-5;
    default: return 1e-9;
  }
}

// ---- OPS-1: attention forward (naive and memory-efficient) against float64 ----
// NMSE. fp32: products and exp in fp32 (~1e-12). Naive attention in fp16/bf16
// rounds the scores and probabilities to the storage dtype before the second
// product (as PyTorch's eager attention does), so three roundings compound:
// bounded like matmul_nmse with 10x room for the softmax's exp amplifying the
// rounding of the scores.
inline double attention_nmse(DType t) {
  switch (t) {
    case DType::f16: return 1e-5;
    case DType::bf16: return 5e-4;
    default: return 1e-9;
  }
}

// ---- OPS-2: backward against float64 central finite differences ----
// Relative L2 of the op's gradient against d/dx of the float64 reference by central
// differences (step 1e-6 relative: truncation and cancellation both ~1e-10, far
// below the bounds). fp32: the op's own fp32 rounding, ~1e-6. fp16/bf16: inputs
// and incoming gradients are stored rounded, every product output and saved
// activation is rounded to 2^-11 resp. 2^-8 relative; a few roundings compound.
inline double grad_rel_l2(DType t) {
  switch (t) {
    case DType::f16: return 5e-3;
    case DType::bf16: return 4e-2;
    default: return 2e-5;
  }
}

// ---- PK-4: memory-efficient attention against naive attention, fp32 ----
// Anchor: PROPERTIES.md PK-4 (fp32 <= 1e-5 relative L2): the two differ only in
// summation order and in when the softmax normalises.
inline constexpr double kAttentionImplsRelL2 = 1e-5;

// PK-4 scaling exponents of peak activation bytes against T: naive keeps the
// T x T probabilities (exponent -> 2, > 1.8 once T >> head dim); memory-efficient
// keeps O(T) (exponent 1, < 1.2 leaves room for fixed-size terms).
inline constexpr double kNaiveAttentionMinExponent = 1.8;
inline constexpr double kMemEfficientAttentionMaxExponent = 1.2;

}  // namespace hr::tol
