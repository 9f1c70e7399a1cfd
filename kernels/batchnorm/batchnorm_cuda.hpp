// CUDA entry points of BatchNorm (defined in batchnorm.cu, called from
// batchnorm.cpp after its argument checks). Plain C++: no CUDA types.
#pragma once

#include "harness/tensor.hpp"

namespace hr::ops::cuda {

void batchnorm_forward_train(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps, float momentum,
                             Tensor& running_mean, Tensor& running_var, Tensor& y, Tensor& save_mean,
                             Tensor& save_rstd);
void batchnorm_forward_eval(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps,
                            const Tensor& running_mean, const Tensor& running_var, Tensor& y);
void batchnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& save_mean,
                        const Tensor& save_rstd, Tensor& dx, Tensor& dgamma, Tensor& dbeta);

}  // namespace hr::ops::cuda
