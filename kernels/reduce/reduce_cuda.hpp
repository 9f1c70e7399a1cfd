// CUDA entry points of the reductions (defined in reduce.cu, called from
// reduce.cpp after its checks). Each synchronises and returns the host value, but
// sum_deferred, whose value is read when first asked for.
#pragma once

#include <vector>

#include "harness/loss_value.hpp"
#include "harness/tensor.hpp"

namespace hr::ops::cuda {

double sum(const Tensor& x);
LossValue sum_deferred(const Tensor& x, double divisor);  // does not wait
double squared_norm(const Tensor& x);
bool any_nonfinite(const Tensor& x);
bool unscale_and_check(Tensor& g, float inv_scale);
bool unscale_and_check_all(const std::vector<Tensor*>& grads, float inv_scale);

}  // namespace hr::ops::cuda
