// CUDA dropout: one thread per Philox counter block, i.e. four consecutive draws
// and the four elements they decide. When the offset is block-aligned and the
// pointers allow it, the four elements move as one packed load and store.
#include "harness/cuda_check.cuh"
#include "kernels/common/cuda_launch.cuh"
#include "kernels/common/dtype_dispatch.hpp"
#include "kernels/common/philox.hpp"
#include "kernels/dropout/dropout_cuda.hpp"
#include "kernels/dropout/dropout_math.hpp"

namespace hr::ops::cuda {
namespace {

using gpu::kThreads;
using gpu::Pack;

// Elements [0, n) use draws offset .. offset + n - 1, i.e. counter blocks
// offset/4 .. (offset + n - 1)/4; thread t takes block offset/4 + t.
template <bool kPacked, typename T>
__global__ void dropout_kernel(const T* x, T* y, int64_t n, uint64_t seed, uint64_t offset, uint32_t threshold,
                               float scale) {
  const uint64_t first = offset >> 2;
  const int64_t blocks = static_cast<int64_t>(((offset + static_cast<uint64_t>(n) - 1) >> 2) - first + 1);
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t b = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; b < blocks; b += stride) {
    const Philox4 r = philox_block(seed, first + static_cast<uint64_t>(b));
    const uint32_t w[4] = {r.x, r.y, r.z, r.w};
    // Element index of word 0 of this block (negative for the first block when
    // the offset is not a multiple of 4).
    const int64_t base = static_cast<int64_t>((first + static_cast<uint64_t>(b)) * 4 - offset);
    if (kPacked && base + 4 <= n) {  // base >= 0 and 4-aligned here
      const Pack<T, 4> vx = reinterpret_cast<const Pack<T, 4>*>(x)[base / 4];
      Pack<T, 4> vy;
#pragma unroll
      for (int k = 0; k < 4; ++k)
        vy.v[k] = from_float<T>(dropout::apply(to_float(vx.v[k]), dropout::keep(w[k], threshold), scale));
      reinterpret_cast<Pack<T, 4>*>(y)[base / 4] = vy;
    } else {
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const int64_t i = base + k;
        if (i >= 0 && i < n) y[i] = from_float<T>(dropout::apply(to_float(x[i]), dropout::keep(w[k], threshold), scale));
      }
    }
  }
}

__global__ void mask_kernel(uint8_t* mask, int64_t n, uint64_t seed, uint64_t offset, uint32_t threshold) {
  const uint64_t first = offset >> 2;
  const int64_t blocks = static_cast<int64_t>(((offset + static_cast<uint64_t>(n) - 1) >> 2) - first + 1);
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t b = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; b < blocks; b += stride) {
    const Philox4 r = philox_block(seed, first + static_cast<uint64_t>(b));
    const uint32_t w[4] = {r.x, r.y, r.z, r.w};
    const int64_t base = static_cast<int64_t>((first + static_cast<uint64_t>(b)) * 4 - offset);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int64_t i = base + k;
      if (i >= 0 && i < n) mask[i] = dropout::keep(w[k], threshold) ? 1 : 0;
    }
  }
}

int64_t counter_blocks(int64_t n, uint64_t offset) {
  return static_cast<int64_t>(((offset + static_cast<uint64_t>(n) - 1) >> 2) - (offset >> 2) + 1);
}

}  // namespace

void dropout_apply(const Tensor& x, uint32_t threshold, float scale, uint64_t seed, uint64_t offset, Tensor& y) {
  const int64_t n = y.numel();
  if (n == 0) return;
  dispatch_float(y.dtype(), "dropout", [&](auto tag) {
    using T = decltype(tag);
    const T* px = x.data_as<T>();
    T* py = y.data_as<T>();
    const cudaStream_t s = gpu::stream_of(y);
    const unsigned grid = gpu::grid_for(counter_blocks(n, offset));
    const auto aligned = [](const void* p) { return (reinterpret_cast<uintptr_t>(p) % (4 * sizeof(T))) == 0; };
    if ((offset & 3u) == 0 && aligned(px) && aligned(py)) {
      dropout_kernel<true><<<grid, kThreads, 0, s>>>(px, py, n, seed, offset, threshold, scale);
    } else {
      dropout_kernel<false><<<grid, kThreads, 0, s>>>(px, py, n, seed, offset, threshold, scale);
    }
    HR_CUDA_CHECK_LAUNCH();
  });
}

void dropout_mask(int64_t numel, uint32_t threshold, uint64_t seed, uint64_t offset, Tensor& mask_u8) {
  if (numel == 0) return;
  mask_kernel<<<gpu::grid_for(counter_blocks(numel, offset)), kThreads, 0, gpu::stream_of(mask_u8)>>>(
      mask_u8.data_as<uint8_t>(), numel, seed, offset, threshold);
  HR_CUDA_CHECK_LAUNCH();
}

}  // namespace hr::ops::cuda
