// Reductions and the loss-scaler's helpers. Results come back to the host (the
// call synchronises). Sums accumulate in double on the CPU and in a fixed-order
// tree on the GPU, so they are deterministic.
#pragma once

#include <vector>

#include "harness/loss_value.hpp"
#include "harness/tensor.hpp"

namespace hr::ops {

double sum(const Tensor& x);
// The same sum divided by `divisor`, read back when first asked for (LossValue): on a
// GPU the call does not wait for the stream.
LossValue sum_deferred(const Tensor& x, double divisor);
double squared_norm(const Tensor& x);
bool any_nonfinite(const Tensor& x);  // any inf or NaN
// g *= inv_scale in place; returns true when any element of g (before scaling)
// was inf or NaN. The scaler calls it once per gradient tensor per step.
bool unscale_and_check(Tensor& g, float inv_scale);
// The same over every tensor of a step at once: one shared non-finite flag read back
// once (one device synchronisation per step, not one per tensor). All tensors must
// live on one device.
bool unscale_and_check_all(const std::vector<Tensor*>& grads, float inv_scale);

}  // namespace hr::ops
