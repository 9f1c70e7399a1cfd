// Optimizer steps, in place. `param` may be fp32 (master weights) or fp16/bf16
// (the MP-4 negative control: weights without a master copy); gradients and
// moments are fp32.
#pragma once

#include <cstdint>
#include <vector>

#include "harness/tensor.hpp"

namespace hr::ops {

struct SgdConfig {
  float lr = 1e-2f;
  float momentum = 0.f;      // 0: plain SGD, no buffer needed
  float weight_decay = 0.f;  // L2 added to the gradient
};
// momentum_buf may be undefined when momentum == 0.
void sgd_step(Tensor& param, const Tensor& grad, Tensor& momentum_buf, const SgdConfig& cfg);

struct AdamWConfig {
  float lr = 1e-3f;
  float beta1 = 0.9f, beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.01f;  // decoupled: param -= lr * wd * param
};
// step is 1-based (bias correction uses beta^step).
void adamw_step(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, int64_t step, const AdamWConfig& cfg);

// One tensor of a many-tensor step: the arguments of adamw_step, by pointer.
struct AdamWTensor {
  Tensor* param;
  const Tensor* grad;
  Tensor* m;
  Tensor* v;
  AdamWConfig cfg;
};
// adamw_step on each tensor, with the same result bit for bit; every tensor is
// checked before any is stepped, and no parameter may be listed twice. On a GPU the aligned tensors of one device and
// dtype pair are stepped together, a few dozen to a launch, as fused optimizers
// (PyTorch's fused AdamW, apex's multi-tensor apply) do: one launch per tensor
// costs the small tensors of a model more than their bytes.
void adamw_step_many(const std::vector<AdamWTensor>& tensors, int64_t step);
// adamw_step_many's checks alone (it makes them itself): for a caller that steps
// other tensors first and must refuse the whole step before any of them moves.
void adamw_check_many(const std::vector<AdamWTensor>& tensors, int64_t step);

}  // namespace hr::ops
