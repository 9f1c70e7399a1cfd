// CUDA entry points of the optimizer steps (defined in optim.cu, called from
// optim.cpp after its checks and with the per-step scalars already computed).
#pragma once

#include "harness/tensor.hpp"
#include "kernels/optim/optim_math.hpp"

namespace hr::ops::cuda {

// momentum_buf is read only when s.use_momentum.
void sgd_step(Tensor& param, const Tensor& grad, Tensor& momentum_buf, const optim::SgdScalars& s);
void adamw_step(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const optim::AdamWScalars& s);

}  // namespace hr::ops::cuda
