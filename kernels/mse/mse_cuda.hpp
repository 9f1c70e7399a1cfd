// CUDA entry points of the MSE op (plain C++ declarations; defined in mse.cu).
#pragma once

#include "harness/tensor.hpp"

namespace hr::ops::cuda {

// losses: fp32, same numel as pred: per-element squared error.
void mse_elementwise(const Tensor& pred, const Tensor& target, Tensor& losses);
void mse_backward(const Tensor& pred, const Tensor& target, float factor, Tensor& dpred);

}  // namespace hr::ops::cuda
