// CUDA 8-bit optimizer state: one thread block per quantisation block. A block's
// new absmax is known only after every element is updated, so each kernel makes
// two passes over its block: the first reduces the absmax, the second recomputes
// the same values (identical arithmetic) and encodes them. No fp32 copy of the
// state is ever stored, which is the point of keeping it in 8 bits.
#include <cstring>
#include <mutex>
#include <vector>

#include "harness/cuda_check.cuh"
#include "kernels/common/cuda_launch.cuh"
#include "kernels/common/dtype_dispatch.hpp"
#include "kernels/optim/optim8_cuda.hpp"

namespace hr::ops::cuda {
namespace {

constexpr int kQ8Threads = 256;

__device__ __forceinline__ float warp_max_abs(float v) {
#pragma unroll
  for (int d = 16; d > 0; d >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, d));
  return v;
}

// Maximum over the thread block; every thread gets it.
__device__ __forceinline__ float block_max(float v, float* scratch) {
  v = warp_max_abs(v);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  return warp_max_abs(lane < nw ? scratch[lane] : 0.f);
}

// The codebooks a device has been given, in global memory: a block copies its
// map into shared memory with coalesced loads (a kernel parameter read at a
// different index in each lane is one serialised constant-cache access per lane).
constexpr int kCodebookSlots = 8;
__device__ q8::Codebook g_codebooks[kCodebookSlots];

__device__ __forceinline__ void load_map(q8::Codebook& dst, int slot) {
  const float* src = g_codebooks[slot].value;
  for (int i = threadIdx.x; i < q8::kCodes; i += blockDim.x) dst.value[i] = __ldg(src + i);
}

// The slot of `map` on the device of `on`, uploaded on first use (into that
// device's copy of the array, on the tensor's stream, then waited for once, a
// counted host wait, so that any stream of the device may read it).
int codebook_slot(const q8::Codebook& map, const Tensor& on) {
  struct Held {
    int device;
    int slot;
    q8::Codebook map;
  };
  static std::mutex mutex;
  static std::vector<Held> held;
  const int device = on.device().record().ordinal;
  const std::lock_guard<std::mutex> lock(mutex);
  int used = 0;
  for (const Held& h : held) {
    if (h.device != device) continue;
    ++used;
    if (std::memcmp(h.map.value, map.value, sizeof map.value) == 0) return h.slot;
  }
  HR_CHECK(used < kCodebookSlots, "8-bit state: more than {} codebooks on device {}", kCodebookSlots, device);
  {
    const ScopedCudaDevice current(device);
    HR_CUDA_CHECK(cudaMemcpyToSymbolAsync(g_codebooks, &map, sizeof map, static_cast<size_t>(used) * sizeof map,
                                          cudaMemcpyHostToDevice, gpu::stream_of(on)));
  }
  on.device().synchronize();
  held.push_back({device, used, map});
  return used;
}

__global__ void quantize_kernel(const float* x, uint8_t* codes, float* absmax, int64_t n, int64_t block,
                                int map) {
  __shared__ q8::Codebook c;
  __shared__ float scratch[32];
  load_map(c, map);
  const int64_t begin = static_cast<int64_t>(blockIdx.x) * block;
  const int64_t end = begin + block < n ? begin + block : n;
  float a = 0.f;
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) a = fmaxf(a, fabsf(x[i]));
  a = block_max(a, scratch);  // its __syncthreads also publishes the codebook
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) codes[i] = q8::quantize(c, x[i], a);
  if (threadIdx.x == 0) absmax[blockIdx.x] = a;
}

__global__ void dequantize_kernel(const uint8_t* codes, const float* absmax, float* out, int64_t n, int64_t block,
                                  int map) {
  __shared__ q8::Codebook c;
  load_map(c, map);
  __syncthreads();
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    out[i] = q8::decode(c, codes[i], absmax[i / block]);
}

struct Maps {
  q8::Codebook m, v;
};
struct MapSlots {
  int m, v;
};

template <typename TP, typename TG>
__global__ void adamw8_kernel(TP* param, const TG* grad, uint8_t* mq, float* ma, uint8_t* vq, float* va, int64_t n,
                              int64_t block, MapSlots maps, optim::AdamWScalars s) {
  __shared__ Maps c;
  __shared__ float scratch[32];
  load_map(c.m, maps.m);
  load_map(c.v, maps.v);
  __syncthreads();
  const int64_t b = blockIdx.x;
  const int64_t begin = b * block;
  const int64_t end = begin + block < n ? begin + block : n;
  const float m_old = ma[b], v_old = va[b];
  float m_abs = 0.f, v_abs = 0.f;
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    float m, v;
    q8::adamw8(to_float(param[i]), to_float(grad[i]), mq[i], vq[i], m_old, v_old, c.m, c.v, s, &m, &v);
    m_abs = fmaxf(m_abs, fabsf(m));
    v_abs = fmaxf(v_abs, fabsf(v));
  }
  m_abs = block_max(m_abs, scratch);
  v_abs = block_max(v_abs, scratch);
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    float m, v;
    param[i] =
        from_float<TP>(q8::adamw8(to_float(param[i]), to_float(grad[i]), mq[i], vq[i], m_old, v_old, c.m, c.v, s, &m, &v));
    mq[i] = q8::quantize(c.m, m, m_abs);
    vq[i] = q8::quantize(c.v, v, v_abs);
  }
  if (threadIdx.x == 0) {  // every thread read the old absmax before the reductions' barriers
    ma[b] = m_abs;
    va[b] = v_abs;
  }
}

}  // namespace

void quantize_blockwise(const Tensor& x, Tensor& codes, Tensor& absmax, int64_t block_size, const q8::Codebook& map) {
  const int64_t n = x.numel();
  if (n == 0) return;
  quantize_kernel<<<static_cast<unsigned>(absmax.numel()), kQ8Threads, 0, gpu::stream_of(x)>>>(
      x.data_as<float>(), codes.data_as<uint8_t>(), absmax.data_as<float>(), n, block_size, codebook_slot(map, x));
  HR_CUDA_CHECK_LAUNCH();
}

void dequantize_blockwise(const Tensor& codes, const Tensor& absmax, Tensor& out, int64_t block_size,
                          const q8::Codebook& map) {
  const int64_t n = out.numel();
  if (n == 0) return;
  dequantize_kernel<<<gpu::grid_for(n), gpu::kThreads, 0, gpu::stream_of(out)>>>(
      codes.data_as<uint8_t>(), absmax.data_as<float>(), out.data_as<float>(), n, block_size, codebook_slot(map, out));
  HR_CUDA_CHECK_LAUNCH();
}

void adamw8bit_step(Tensor& param, const Tensor& grad, Tensor& m_codes, Tensor& m_absmax, Tensor& v_codes,
                    Tensor& v_absmax, int64_t block_size, const q8::Codebook& m_map, const q8::Codebook& v_map,
                    const optim::AdamWScalars& s) {
  const int64_t n = param.numel();
  if (n == 0) return;
  const MapSlots maps{codebook_slot(m_map, param), codebook_slot(v_map, param)};
  dispatch_float2(param.dtype(), grad.dtype(), "adamw8bit_step", [&](auto tp, auto tg) {
    using TP = decltype(tp);
    using TG = decltype(tg);
    adamw8_kernel<TP, TG><<<static_cast<unsigned>(m_absmax.numel()), kQ8Threads, 0, gpu::stream_of(param)>>>(
        param.data_as<TP>(), grad.data_as<TG>(), m_codes.data_as<uint8_t>(), m_absmax.data_as<float>(),
        v_codes.data_as<uint8_t>(), v_absmax.data_as<float>(), n, block_size, maps, s);
    HR_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace hr::ops::cuda
