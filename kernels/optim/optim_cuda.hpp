// CUDA entry points of the optimizer steps (defined in optim.cu, called from
// optim.cpp after its checks and with the per-step scalars already computed).
#pragma once

#include <vector>

#include "harness/tensor.hpp"
#include "kernels/optim/optim_math.hpp"

namespace hr::ops::cuda {

// momentum_buf is read only when s.use_momentum.
void sgd_step(Tensor& param, const Tensor& grad, Tensor& momentum_buf, const optim::SgdScalars& s);
void adamw_step(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const optim::AdamWScalars& s);

// One AdamW step of many tensors in as few launches as their count allows, the same
// bits as adamw_step on each. The caller groups them: one device and dtype pair,
// every tensor one that adamw_many_takes (4-element aligned pointers).
struct AdamWArgs {
  Tensor* param;
  const Tensor* grad;
  Tensor* m;
  Tensor* v;
  optim::AdamWScalars s;
};
bool adamw_many_takes(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v);
void adamw_step_many(const std::vector<AdamWArgs>& ts);
// The most tensors one launch of adamw_step_many takes.
int adamw_tensors_per_launch();

}  // namespace hr::ops::cuda
