// BatchNorm over the batch dimension of x [N, C] (per channel c, statistics over n).
// Training: biased batch variance normalises; running_var is updated with the
// unbiased one (N / (N - 1)), running = (1 - momentum) * running + momentum * batch,
// as PyTorch does. Eval: normalises with the running statistics.
#pragma once

#include "harness/tensor.hpp"

namespace hr::ops {

// save_mean, save_rstd: fp32 [C] for the backward pass. running_*: fp32 [C], updated.
void batchnorm_forward_train(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps, float momentum,
                             Tensor& running_mean, Tensor& running_var, Tensor& y, Tensor& save_mean,
                             Tensor& save_rstd);
void batchnorm_forward_eval(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps,
                            const Tensor& running_mean, const Tensor& running_var, Tensor& y);
// dx overwritten; dgamma, dbeta += (fp32 [C]).
void batchnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& save_mean,
                        const Tensor& save_rstd, Tensor& dx, Tensor& dgamma, Tensor& dbeta);

}  // namespace hr::ops
