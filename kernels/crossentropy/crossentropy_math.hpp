// Fused softmax cross-entropy: scalar math shared by the CPU loop and the CUDA
// kernels, and the weight every reduction gives one token's gradient.
#pragma once

#include <cmath>

#include "kernels/common/hd.hpp"

namespace hr::ops::ce {

// log-sum-exp of a row from its max and sum of exp(x - max).
HR_HD float logsumexp(float row_max, float sum_exp) { return row_max + logf(sum_exp); }

// Per-token loss: -log softmax(x)[target] = lse - x[target].
HR_HD float token_loss(float lse, float x_target) { return lse - x_target; }

// d(weight * loss)/dx of one element: weight * (softmax(x) - onehot).
HR_HD float dlogit(float x, float lse, bool is_target, float weight) {
  return (expf(x - lse) - (is_target ? 1.f : 0.f)) * weight;
}

}  // namespace hr::ops::ce
