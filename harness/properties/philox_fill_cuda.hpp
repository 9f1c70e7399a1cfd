// Device-side Philox draws for OPS-3: fills a device buffer with draws
// offset .. offset + n - 1 of a seed's stream (and their uniform floats), so the
// property can compare the GPU's stream with the host's bit for bit.
#pragma once

#include <cstddef>
#include <cstdint>

#include "harness/device.hpp"

namespace hr {

// out_u32 and out_f32 are device buffers of n elements on dev (a CUDA Device).
void philox_fill_cuda(Device& dev, uint32_t* out_u32, float* out_f32, uint64_t seed, uint64_t offset, size_t n);

}  // namespace hr
