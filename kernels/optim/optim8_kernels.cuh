// The kernels of the CUDA 8-bit optimizer state (optim8.cu): a block's new absmax
// is known only after every element is updated, so no code can be written before
// the block is reduced. The AdamW step keeps its elements in registers across that
// reduction (the tiled kernel); other block sizes and unaligned views take one
// thread block per quantisation block and two passes, the second recomputing the
// same values (identical arithmetic) to encode them. No fp32 copy of the state is
// ever stored, which is the point of keeping it in 8 bits. Include only from
// optim8.cu, or after suites/common/warp_emulation.hpp, which runs the same kernels
// on emulated warps on a CPU (HR_WARP_EMULATION).
#pragma once

#include <cstdint>
#include <vector>

#include "harness/check.hpp"
#include "kernels/common/float16.hpp"
#include "kernels/common/many_tensor_launch.hpp"
#include "kernels/common/shared_memory.cuh"
#include "kernels/optim/optim8_cuda.hpp"
#include "kernels/optim/optim_math.hpp"
#include "kernels/optim/quant8_math.hpp"

// In an unnamed namespace, as kernels of one translation unit: the emulated
// kernels of a test binary must not share their names with the library's.
namespace hr::ops::cuda::q8k {
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

__global__ void quantize_kernel(const float* x, uint8_t* codes, float* absmax, int64_t n, int64_t block,
                                int map) {
  HR_SHARED(q8::Codebook, c);
  HR_SHARED(float[32], scratch);
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
  HR_SHARED(q8::Codebook, c);
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
  HR_SHARED(Maps, c);
  HR_SHARED(float[32], scratch);
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

// The tiled kernel, for a power-of-two block of 8 to 2048 elements and aligned
// tensors (the sizes the optimizer uses): a thread block of 256 threads takes a
// tile of 2048 elements, each thread 8 consecutive ones, read once into registers
// with 16-byte loads (8-byte ones for the codes) and written once. The block's
// absmax is reduced among the threads that share it: by warp shuffles alone for a
// block of up to 256 elements, through one barrier for a larger one. Each element
// goes through the same q8::adamw8 and q8::quantize as in the kernel above and on
// the CPU, so the results are the same bit for bit; only the traffic changes.
constexpr int kTileThreads = 256;
constexpr int kPerThread = 8;
constexpr int64_t kTileElems = int64_t{kTileThreads} * kPerThread;

// A thread's 8 elements live in 32-bit words (registers): kWords<T> of them, one
// element per word for fp32, two for 16-bit types (low half first, as in memory).
template <typename T>
constexpr int kWords = static_cast<int>(sizeof(T)) * kPerThread / 4;

// Plain loads for the parameter and the codes, which the same kernel writes back
// (the read-only __ldg path does not allow that); the gradient takes __ldg.
template <bool kReadOnly, typename T>
__device__ __forceinline__ void load_words(const T* p, uint32_t (&u)[kWords<T>]) {
  static_assert(kWords<T> % 4 == 0, "whole 16-byte words");
  const uint4* src = reinterpret_cast<const uint4*>(p);
#pragma unroll
  for (int w = 0; w < kWords<T> / 4; ++w) {
    const uint4 x = kReadOnly ? __ldg(src + w) : src[w];
    u[4 * w] = x.x;
    u[4 * w + 1] = x.y;
    u[4 * w + 2] = x.z;
    u[4 * w + 3] = x.w;
  }
}

template <typename T>
__device__ __forceinline__ void store_words(T* p, const uint32_t (&u)[kWords<T>]) {
  uint4* dst = reinterpret_cast<uint4*>(p);
#pragma unroll
  for (int w = 0; w < kWords<T> / 4; ++w) dst[w] = make_uint4(u[4 * w], u[4 * w + 1], u[4 * w + 2], u[4 * w + 3]);
}

template <typename T>
__device__ __forceinline__ T word_element(const uint32_t (&u)[kWords<T>], int j) {
  if constexpr (sizeof(T) == 4) {
    return __uint_as_float(u[j]);
  } else {
    T t;
    t.bits = static_cast<uint16_t>(u[j >> 1] >> (16 * (j & 1)));
    return t;
  }
}

template <typename T>
__device__ __forceinline__ void set_word_element(uint32_t (&u)[kWords<T>], int j, T x) {
  if constexpr (sizeof(T) == 4) {
    u[j] = __float_as_uint(x);
  } else {
    const int shift = 16 * (j & 1);
    u[j >> 1] = (u[j >> 1] & ~(0xffffu << shift)) | (static_cast<uint32_t>(x.bits) << shift);
  }
}

// Codes: 8 bytes in two words.
__device__ __forceinline__ uint8_t code_at(const uint32_t (&c)[2], int j) {
  return static_cast<uint8_t>(c[j >> 2] >> (8 * (j & 3)));
}
__device__ __forceinline__ void set_code(uint32_t (&c)[2], int j, uint8_t x) {
  const int shift = 8 * (j & 3);
  c[j >> 2] = (c[j >> 2] & ~(0xffu << shift)) | (static_cast<uint32_t>(x) << shift);
}

// One tile (`tile`, counted from the tensor's start) of one tensor, by the whole
// thread block; the caller has begun loading the codebooks into `c` (the barrier
// below publishes them). Both tiled kernels are this function, so a tensor steps
// the same bit for bit whichever launch took it.
template <typename TP, typename TG>
__device__ __forceinline__ void adamw8_tile(TP* param, const TG* grad, uint8_t* mq, float* ma, uint8_t* vq, float* va,
                                            int64_t n, int block, int64_t tile, const Maps& c, float2* scratch,
                                            const optim::AdamWScalars& s) {
  const int64_t first = tile * kTileElems + threadIdx.x * kPerThread;
  const int count = first >= n ? 0 : (n - first < kPerThread ? static_cast<int>(n - first) : kPerThread);
  uint32_t p[kWords<TP>] = {}, g[kWords<TG>] = {}, m_code[2] = {}, v_code[2] = {};
  if (count == kPerThread) {
    load_words<false>(param + first, p);
    load_words<true>(grad + first, g);
    const uint2 mc = *reinterpret_cast<const uint2*>(mq + first), vc = *reinterpret_cast<const uint2*>(vq + first);
    m_code[0] = mc.x;
    m_code[1] = mc.y;
    v_code[0] = vc.x;
    v_code[1] = vc.y;
  } else {
#pragma unroll
    for (int j = 0; j < kPerThread; ++j) {
      if (j >= count) break;
      set_word_element<TP>(p, j, param[first + j]);
      set_word_element<TG>(g, j, grad[first + j]);
      set_code(m_code, j, mq[first + j]);
      set_code(v_code, j, vq[first + j]);
    }
  }
  // A block size is a multiple of kPerThread, so a thread's elements share one block.
  const int64_t b = first / block;
  const float m_old = count > 0 ? ma[b] : 0.f, v_old = count > 0 ? va[b] : 0.f;
  __syncthreads();  // the codebooks are in shared memory

  float m[kPerThread], v[kPerThread];
  float m_abs = 0.f, v_abs = 0.f;
#pragma unroll
  for (int j = 0; j < kPerThread; ++j) {
    m[j] = v[j] = 0.f;
    if (j >= count) continue;
    const float next = q8::adamw8(to_float(word_element<TP>(p, j)), to_float(word_element<TG>(g, j)),
                                  code_at(m_code, j), code_at(v_code, j), m_old, v_old, c.m, c.v, s, &m[j], &v[j]);
    set_word_element<TP>(p, j, from_float<TP>(next));
    m_abs = fmaxf(m_abs, fabsf(m[j]));
    v_abs = fmaxf(v_abs, fabsf(v[j]));
  }

  // The absmax over the threads of one block: `sharers` consecutive threads, a
  // power of two. Every lane takes part in the shuffles (lanes past the end hold 0).
  const int sharers = block / kPerThread;
  const int in_warp = sharers < 32 ? sharers : 32;
  for (int d = in_warp / 2; d > 0; d >>= 1) {
    m_abs = fmaxf(m_abs, __shfl_xor_sync(0xffffffffu, m_abs, d));
    v_abs = fmaxf(v_abs, __shfl_xor_sync(0xffffffffu, v_abs, d));
  }
  if (sharers > 32) {  // the same for the whole thread block, so the barrier is uniform
    const int warp = threadIdx.x >> 5, warps = sharers >> 5, group = warp & ~(warps - 1);
    if ((threadIdx.x & 31) == 0) scratch[warp] = make_float2(m_abs, v_abs);
    __syncthreads();
    for (int w = group; w < group + warps; ++w) {
      m_abs = fmaxf(m_abs, scratch[w].x);
      v_abs = fmaxf(v_abs, scratch[w].y);
    }
  }

  if (count == 0) return;
#pragma unroll
  for (int j = 0; j < kPerThread; ++j) {
    set_code(m_code, j, q8::quantize(c.m, m[j], m_abs));
    set_code(v_code, j, q8::quantize(c.v, v[j], v_abs));
  }
  if (count == kPerThread) {
    store_words(param + first, p);
    *reinterpret_cast<uint2*>(mq + first) = make_uint2(m_code[0], m_code[1]);
    *reinterpret_cast<uint2*>(vq + first) = make_uint2(v_code[0], v_code[1]);
  } else {
#pragma unroll
    for (int j = 0; j < kPerThread; ++j) {
      if (j >= count) break;
      param[first + j] = word_element<TP>(p, j);
      mq[first + j] = code_at(m_code, j);
      vq[first + j] = code_at(v_code, j);
    }
  }
  // The block's first thread writes its absmax: every thread of the block read the
  // old one before the shuffles (or the barrier) that gave it this value.
  if (threadIdx.x % sharers == 0) {
    ma[b] = m_abs;
    va[b] = v_abs;
  }
}

template <typename TP, typename TG>
__global__ void __launch_bounds__(kTileThreads) adamw8_tiled_kernel(TP* param, const TG* grad, uint8_t* mq, float* ma,
                                                                    uint8_t* vq, float* va, int64_t n, int block,
                                                                    MapSlots maps, optim::AdamWScalars s) {
  HR_SHARED(Maps, c);
  HR_SHARED(float2[kTileThreads / 32], scratch);
  load_map(c.m, maps.m);
  load_map(c.v, maps.v);
  adamw8_tile(param, grad, mq, ma, vq, va, n, block, blockIdx.x, c, scratch, s);
}

// Many tensors in one launch: each thread block finds its tensor by a binary search
// of the tiles' starts (the same for the whole block, read from the parameter bank)
// and steps one tile of it. The launch's tensors share their dtypes, block size and
// maps; each has its own scalars (weight decay differs between tensors). Kept within
// the 4 KiB of kernel parameters every driver takes.
struct Q8TensorArg {
  void* param;
  const void* grad;
  uint8_t* mq;
  float* ma;
  uint8_t* vq;
  float* va;
  int64_t n;
  optim::AdamWScalars s;
};
constexpr int kQ8MaxTensorsPerLaunch = 36;
using Q8Launch = gpu::ManyTensorLaunch<Q8TensorArg, kQ8MaxTensorsPerLaunch>;  // pieces: tiles
static_assert(sizeof(Q8Launch) + sizeof(int) + sizeof(MapSlots) <= 4096, "kernel parameters within 4 KiB");

template <typename TP, typename TG>
__global__ void __launch_bounds__(kTileThreads) adamw8_multi_kernel(const __grid_constant__ Q8Launch L, int block,
                                                                    MapSlots maps) {
  HR_SHARED(Maps, c);
  HR_SHARED(float2[kTileThreads / 32], scratch);
  load_map(c.m, maps.m);
  load_map(c.v, maps.v);
  const int tile = static_cast<int>(blockIdx.x), k = gpu::tensor_of(L, tile);
  const Q8TensorArg& a = L.t[k];
  adamw8_tile(static_cast<TP*>(a.param), static_cast<const TG*>(a.grad), a.mq, a.ma, a.vq, a.va, a.n, block,
              tile - L.start[k], c, scratch, a.s);
}

// The grid of the tiled kernel over n elements: one thread block a tile.
inline unsigned tiled_grid(int64_t n) { return static_cast<unsigned>((n + kTileElems - 1) / kTileElems); }

// A many-tensor launch's arguments of one tensor.
inline Q8TensorArg q8_arg(const AdamW8bitArgs& a) {
  return Q8TensorArg{a.param->data(),
                     a.grad->data(),
                     a.m_codes->data_as<uint8_t>(),
                     a.m_absmax->data_as<float>(),
                     a.v_codes->data_as<uint8_t>(),
                     a.v_absmax->data_as<float>(),
                     a.param->numel(),
                     a.s};
}

// Packs tensors into as few launches of the many-tensor kernel as it takes.
template <typename Fn>
void for_each_q8_launch(const std::vector<Q8TensorArg>& ts, Fn&& launch) {
  gpu::for_each_launch<Q8Launch>(ts, kTileElems, "adamw8bit_step_many", launch);
}

bool aligned(const void* p, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

// Whether adamw8bit_step may take the tiled kernel.
bool tiles(int64_t block, const void* param, const void* grad, const void* mq, const void* vq) {
  return block >= kPerThread && block <= kTileElems && (block & (block - 1)) == 0 && aligned(param, 16) &&
         aligned(grad, 16) && aligned(mq, 8) && aligned(vq, 8);
}

}  // namespace
}  // namespace hr::ops::cuda::q8k
