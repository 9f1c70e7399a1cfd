// Inverted dropout drawing from the shared Philox stream (kernels/common/philox.hpp):
// element i keeps iff philox_draw(seed, offset + i) >= threshold, with
// threshold = round(p * 2^32) (an integer comparison, so both backends agree
// bit for bit), and is scaled by 1 / (1 - p). No mask is stored: the backward pass
// and any recomputation replay it from (seed, offset). The caller advances its
// offset by philox_advance(numel) after each draw.
#pragma once

#include <cstdint>

#include "harness/tensor.hpp"

namespace hr::ops {

uint32_t dropout_threshold(float p);  // p in [0, 1)
void dropout_forward(const Tensor& x, float p, uint64_t seed, uint64_t offset, Tensor& y);
void dropout_backward(const Tensor& dy, float p, uint64_t seed, uint64_t offset, Tensor& dx);
// The keep mask as 0/1 bytes, for dumps and tests.
void dropout_mask(int64_t numel, float p, uint64_t seed, uint64_t offset, Tensor& mask_u8);

}  // namespace hr::ops
