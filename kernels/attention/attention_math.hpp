// Memory-efficient attention: the scalar math of the online softmax, shared by the
// CPU loop and the CUDA kernels (the mask predicate is softmax's, sm::allowed, so
// naive and memory-efficient attention mask identically). One query row keeps a
// running max m, a running sum l of exp(score - m) and an unnormalised output; each
// key chunk rescales them (Rabe & Staats 2021; FlashAttention-2's forward).
#pragma once

#include <cmath>

#include "kernels/common/hd.hpp"

namespace hr::ops::attn {

// e^x, the exponential of the natural-log form.
struct NaturalExp {
  HR_HD float operator()(float x) const { return expf(x); }
};

// Folds a chunk whose largest allowed scaled score is chunk_max into the running
// (m, l): m becomes the new max, l is rescaled, and the factor returned must
// multiply the running output too. A chunk with nothing allowed (chunk_max = -inf)
// changes nothing (factor 1); the first allowed chunk starts from l = 0. `exp_fn` is
// the exponential of the units m is kept in (a base-2 form passes 2^x).
template <typename Exp = NaturalExp>
HR_HD float online_rescale(float& m, float& l, float chunk_max, Exp exp_fn = {}) {
  if (chunk_max == -INFINITY) return 1.f;
  const float m_new = fmaxf(m, chunk_max);
  const float factor = m == -INFINITY ? 0.f : exp_fn(m - m_new);
  m = m_new;
  l *= factor;
  return factor;
}

// Unnormalised weight of an allowed key under the running max.
HR_HD float online_weight(float scaled, float m) { return expf(scaled - m); }

// 1 / l for the final normalisation; a row with no allowed key gives zeros (not NaN),
// as the naive softmax does.
HR_HD float inv_row_sum(float l) { return l > 0.f ? 1.f / l : 0.f; }

// The row's log-sum-exp, all the backward pass needs to recompute probabilities;
// -inf for a row with no allowed key (its probabilities are never recomputed).
HR_HD float row_lse(float m, float l) { return l > 0.f ? m + logf(l) : -INFINITY; }

// Probability recomputed from the saved log-sum-exp.
HR_HD float prob_from_lse(float scaled, float lse) { return expf(scaled - lse); }

// Gradient of the scaled score: p (dp - D) with D = rowsum(dO * O) (FlashAttention-2),
// which equals sum_s p_s dp_s; the caller multiplies by scale once per row.
HR_HD float dscore_unscaled(float p, float dp, float row_dot) { return p * (dp - row_dot); }

}  // namespace hr::ops::attn
