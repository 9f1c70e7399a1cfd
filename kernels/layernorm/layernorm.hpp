// LayerNorm over the last dimension of x viewed as [N, C].
// y = (x - mean) * rstd * gamma + beta, rstd = 1 / sqrt(var + eps), biased var.
#pragma once

#include "harness/tensor.hpp"

namespace hr::ops {

// mean, rstd: fp32 [N], saved for the backward pass.
void layernorm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps, Tensor& y,
                       Tensor& mean, Tensor& rstd);
// dx = (overwritten); dgamma, dbeta += (fp32 [C]).
void layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& mean,
                        const Tensor& rstd, Tensor& dx, Tensor& dgamma, Tensor& dbeta);

}  // namespace hr::ops
