// OPS-3's device draws: one thread per draw, the same HR_HD Philox the host uses.
#include <cuda_runtime.h>

#include "harness/cuda_check.cuh"
#include "harness/properties/philox_fill_cuda.hpp"
#include "kernels/common/philox.hpp"
#include "kernels/common/philox_host.hpp"

namespace hr {
namespace {

// flip_draw >= 0: that draw of the fill has flip_mask xored in (PhiloxFault, OPS-3's
// device control), before its uniform is made from it.
__global__ void philox_fill_kernel(uint32_t* out_u32, float* out_f32, uint64_t seed, uint64_t offset, size_t n,
                                   int64_t flip_draw, uint32_t flip_mask) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    uint32_t x = philox_draw(seed, offset + i);
    if (static_cast<int64_t>(i) == flip_draw) x ^= flip_mask;
    out_u32[i] = x;
    out_f32[i] = uniform_from_u32(x);
  }
}

}  // namespace

void philox_fill_cuda(Device& dev, uint32_t* out_u32, float* out_f32, uint64_t seed, uint64_t offset, size_t n) {
  if (n == 0) return;
  const int threads = 256;
  const size_t want = (n + threads - 1) / threads;
  const int blocks = static_cast<int>(want < 65535 ? want : 65535);
  const PhiloxFault* f = faults::active<PhiloxFault>();
  philox_fill_kernel<<<blocks, threads, 0, static_cast<cudaStream_t>(dev.cuda_stream())>>>(
      out_u32, out_f32, seed, offset, n, f ? f->flip_draw : -1, f ? f->flip_mask : 0u);
  HR_CUDA_CHECK_LAUNCH();
}

}  // namespace hr
