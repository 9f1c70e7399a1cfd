// Masked row softmax: scalar math shared by the CPU loop and the CUDA kernels.
// The mask predicate lives here once, so "which keys may a query see" cannot
// drift between backends.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/common/hd.hpp"

namespace hr::ops::sm {

// Mask inputs of one row (query t of batch row b), resolved by the caller:
// kv_len = key_valid_len[b] or INT32_MAX; seg_row = &segment_ids[b * T] or nullptr.
struct RowMask {
  bool causal;
  int32_t t;
  int32_t kv_len;
  const int32_t* seg_row;
};

HR_HD bool allowed(const RowMask& m, int32_t s) {
  if (m.causal && s > m.t) return false;
  if (s >= m.kv_len) return false;
  if (m.seg_row != nullptr && m.seg_row[s] != m.seg_row[m.t]) return false;
  return true;
}

// Without segments a row's allowed keys are the prefix [0, allowed_end): the keys
// `allowed` takes, for loops that run over whole rows.
HR_HD int32_t allowed_end(const RowMask& m, int32_t S) {
  int32_t end = S;
  if (m.causal && m.t + 1 < end) end = m.t + 1;
  if (m.kv_len < end) end = m.kv_len;
  return end < 0 ? 0 : end;
}

// Probability of an allowed position from the row's max and 1 / sum of exps.
HR_HD float prob(float scaled, float row_max, float inv_sum) { return expf(scaled - row_max) * inv_sum; }

// Online softmax: merge two partial (max, sum of exp(x - max)) pairs. An empty
// partial has max = -inf and sum = 0.
HR_HD void online_merge(float& m, float& s, float m2, float s2) {
  if (m2 == -INFINITY) return;
  if (m == -INFINITY) {
    m = m2;
    s = s2;
    return;
  }
  const float nm = fmaxf(m, m2);
  s = s * expf(m - nm) + s2 * expf(m2 - nm);
  m = nm;
}

// Adds one value to a partial (max, sum of exp(x - max)) with one exponential.
// A -inf value contributes nothing (exp(-inf) = 0; it must not make NaN).
HR_HD void online_add(float& m, float& s, float v) {
  if (v == -INFINITY) return;
  if (v > m) {
    s = s * expf(m - v) + 1.f;
    m = v;
  } else {
    s += expf(v - m);
  }
}

// dscore = scale * p * (dp - sum_s dp * p).
HR_HD float dscore(float p, float dp, float dot, float scale) { return scale * p * (dp - dot); }

}  // namespace hr::ops::sm
