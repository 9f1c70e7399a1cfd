// CUDA entry points of dropout (defined in dropout.cu, called from dropout.cpp
// after its checks). Plain C++: no CUDA types.
#pragma once

#include <cstdint>

#include "harness/tensor.hpp"

namespace hr::ops::cuda {

// y = keep ? x * scale : 0 (forward and backward alike).
void dropout_apply(const Tensor& x, uint32_t threshold, float scale, uint64_t seed, uint64_t offset, Tensor& y);
void dropout_mask(int64_t numel, uint32_t threshold, uint64_t seed, uint64_t offset, Tensor& mask_u8);

}  // namespace hr::ops::cuda
