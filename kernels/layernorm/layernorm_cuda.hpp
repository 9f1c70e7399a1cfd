// CUDA entry points of LayerNorm (defined in layernorm.cu, called from
// layernorm.cpp after its argument checks). Plain C++: no CUDA types.
#pragma once

#include "harness/tensor.hpp"

namespace hr::ops::cuda {

void layernorm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps, Tensor& y,
                       Tensor& mean, Tensor& rstd);
void layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& mean,
                        const Tensor& rstd, Tensor& dx, Tensor& dgamma, Tensor& dbeta);

}  // namespace hr::ops::cuda
