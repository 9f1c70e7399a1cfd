// MSE element math shared by the CPU loop and the CUDA kernel.
#pragma once

#include "kernels/common/hd.hpp"

namespace hr::ops {

HR_HD float mse_elem_loss(float p, float t) {
  const float d = p - t;
  return d * d;
}
// d/dp of factor * (p - t)^2, where factor = loss_scale / normaliser.
HR_HD float mse_elem_grad(float p, float t, float factor) { return 2.f * factor * (p - t); }

}  // namespace hr::ops
