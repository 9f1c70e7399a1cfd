// Mean-squared-error loss for the regression head of the controlled MLP:
// loss = sum_i (pred_i - target_i)^2 reduced like the cross-entropy (mean over the
// elements of this call, sum, or sum / a caller-given count: the elements of the
// whole accumulation window). The backward pass folds in a loss scale (fp16).
#pragma once

#include "harness/loss_value.hpp"
#include "harness/tensor.hpp"
#include "kernels/crossentropy/crossentropy.hpp"

namespace hr::ops {

struct MseConfig {
  LossReduction reduction = LossReduction::mean;
  double count = 0;        // for sum_div_count
  float loss_scale = 1.f;  // dpred is multiplied by it
};

// pred, target: same shape, any float dtype. Returns the reduced loss; on a GPU it is
// read back when first asked for (LossValue).
LossValue mse_forward(const Tensor& pred, const Tensor& target, const MseConfig& cfg);
// dpred (overwritten, dtype of pred or fp32) = loss_scale * d(reduced loss)/d(pred).
void mse_backward(const Tensor& pred, const Tensor& target, const MseConfig& cfg, Tensor& dpred);

}  // namespace hr::ops
