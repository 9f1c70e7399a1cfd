// Building blocks of the row-wise CUDA kernels (layernorm, softmax, cross-entropy,
// batchnorm; CUDA translation units only): reductions over the threads of a row
// (warp shuffles, plus shared memory when a row spans several warps), row loops
// with 16-byte packed loads/stores, and deterministic column sums (per-block
// partials, then a fixed-order final sum) for parameter gradients. Every reduction
// has a fixed order, so the same inputs give the same bits; no float atomics.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "harness/cuda_check.cuh"
#include "kernels/common/cuda_launch.cuh"
#include "kernels/common/float16.hpp"
#include "kernels/softmax/softmax_math.hpp"

namespace hr::gpu {

// ---- Reductions over the threads of one row ---------------------------------------
// A row is blockDim.x threads (a multiple of 32, at most 1024); a block holds
// blockDim.y rows, and blockDim.y > 1 only when a row is one warp. Butterfly
// (xor) shuffles leave the same bits in every lane: each step adds the same two
// values, and float addition is commutative.
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int d = 16; d > 0; d >>= 1) v += __shfl_xor_sync(0xffffffffu, v, d);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int d = 16; d > 0; d >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, d));
  return v;
}

__device__ __forceinline__ void warp_online(float& m, float& s) {
#pragma unroll
  for (int d = 16; d > 0; d >>= 1) {
    const float m2 = __shfl_xor_sync(0xffffffffu, m, d);
    const float s2 = __shfl_xor_sync(0xffffffffu, s, d);
    ops::sm::online_merge(m, s, m2, s2);
  }
}

// Shared scratch for a row reduction: 32 warps' partials of two quantities.
struct RowScratch {
  float a[32];
  float b[32];
};

// Sum over the row's threads; every thread of the row gets the result.
__device__ __forceinline__ float row_sum(float v, RowScratch& sh) {
  v = warp_sum(v);
  if (blockDim.x == 32) return v;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  __syncthreads();  // the scratch may still be read by a previous reduction
  if (lane == 0) sh.a[warp] = v;
  __syncthreads();
  return warp_sum(lane < nw ? sh.a[lane] : 0.f);
}

// Online-softmax (max, sum of exp(x - max)) over the row's threads.
__device__ __forceinline__ void row_online(float& m, float& s, RowScratch& sh) {
  warp_online(m, s);
  if (blockDim.x == 32) return;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  __syncthreads();
  if (lane == 0) {
    sh.a[warp] = m;
    sh.b[warp] = s;
  }
  __syncthreads();
  m = lane < nw ? sh.a[lane] : -INFINITY;
  s = lane < nw ? sh.b[lane] : 0.f;
  warp_online(m, s);
}

// Threads per row for rows of n elements: one warp up to 512 elements (several
// rows per block), then enough warps that each thread handles ~8-16 elements.
inline dim3 row_block(int64_t n) {
  if (n <= 512) return dim3(32, 4);
  if (n <= 2048) return dim3(128, 1);
  if (n <= 8192) return dim3(256, 1);
  return dim3(512, 1);
}
inline unsigned row_grid(int64_t rows, dim3 block) {
  return static_cast<unsigned>((rows + block.y - 1) / block.y);
}

// Elements per 16-byte pack of T.
template <typename T>
constexpr int pack_of() {
  return static_cast<int>(16 / sizeof(T));
}

// Whether rows of n elements starting at p (row r at p + r * n) all allow packs.
template <typename T>
inline bool rows_packable(const T* p, int64_t n) {
  return aligned16(p) && n % pack_of<T>() == 0;
}

// f(i, value) for this thread's elements of row[0, n): packs of 16 bytes when
// `vec`, else element by element; thread t takes packs t, t + blockDim.x, ...
template <typename T, typename F>
__device__ __forceinline__ void row_read(const T* row, int64_t n, bool vec, F&& f) {
  constexpr int N = pack_of<T>();
  if (vec) {
    for (int64_t p = threadIdx.x; p < n / N; p += blockDim.x) {
      const Pack<T, N> v = reinterpret_cast<const Pack<T, N>*>(row)[p];
#pragma unroll
      for (int k = 0; k < N; ++k) f(p * N + k, to_float(v.v[k]));
    }
  } else {
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) f(i, to_float(row[i]));
  }
}

// out[i] = f(i, a[i], b[i]) over the row (b may be a, for one input).
template <typename TO, typename T, typename F>
__device__ __forceinline__ void row_write(TO* out, const T* a, const T* b, int64_t n, bool vec, F&& f) {
  constexpr int N = pack_of<T>() < pack_of<TO>() ? pack_of<T>() : pack_of<TO>();
  if (vec) {
    for (int64_t p = threadIdx.x; p < n / N; p += blockDim.x) {
      const Pack<T, N> va = reinterpret_cast<const Pack<T, N>*>(a)[p];
      const Pack<T, N> vb = reinterpret_cast<const Pack<T, N>*>(b)[p];
      Pack<TO, N> vo;
#pragma unroll
      for (int k = 0; k < N; ++k) vo.v[k] = from_float<TO>(f(p * N + k, to_float(va.v[k]), to_float(vb.v[k])));
      reinterpret_cast<Pack<TO, N>*>(out)[p] = vo;
    }
  } else {
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) out[i] = from_float<TO>(f(i, to_float(a[i]), to_float(b[i])));
  }
}

// ---- Deterministic column sums over [N, C] ------------------------------------------
// K quantities per element, term(n, c, float (&v)[K]); pass 1 gives per-chunk
// partials [K][chunks][C] (32 columns x 8 row-threads per block, a fixed order
// inside), pass 2 sums the chunks in order and calls finish(c, float (&s)[K]).
inline constexpr int kColTile = 32, kColRows = 8;

template <int K, typename Term>
__global__ void col_partials_kernel(int64_t N, int64_t C, int64_t rows_per_chunk, Term term, float* partial) {
  __shared__ float sh[K][kColRows][kColTile];
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kColTile + threadIdx.x;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * rows_per_chunk;
  const int64_t r1 = r0 + rows_per_chunk < N ? r0 + rows_per_chunk : N;
  float acc[K];
#pragma unroll
  for (int k = 0; k < K; ++k) acc[k] = 0.f;
  if (c < C) {
    for (int64_t n = r0 + threadIdx.y; n < r1; n += kColRows) {
      float v[K];
      term(n, c, v);
#pragma unroll
      for (int k = 0; k < K; ++k) acc[k] += v[k];
    }
  }
#pragma unroll
  for (int k = 0; k < K; ++k) sh[k][threadIdx.y][threadIdx.x] = acc[k];
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    for (int k = 0; k < K; ++k) {
      float s = 0.f;
      for (int r = 0; r < kColRows; ++r) s += sh[k][r][threadIdx.x];
      partial[(static_cast<int64_t>(k) * gridDim.y + blockIdx.y) * C + c] = s;
    }
  }
}

template <int K, typename Finish>
__global__ void col_finish_kernel(int64_t C, int chunks, const float* partial, Finish finish) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float s[K];
  for (int k = 0; k < K; ++k) {
    float t = 0.f;
    for (int r = 0; r < chunks; ++r) t += partial[(static_cast<int64_t>(k) * chunks + r) * C + c];
    s[k] = t;
  }
  finish(c, s);
}

// Runs both passes; `partial` is fp32 workspace of col_sum_workspace(N, C, K) floats.
inline int64_t col_rows_per_chunk(int64_t N) {
  const int64_t r = (N + 255) / 256;  // at most 256 chunks
  return r < 64 ? 64 : r;
}
inline int64_t col_sum_workspace(int64_t N, int64_t C, int K) {
  return static_cast<int64_t>(K) * ((N + col_rows_per_chunk(N) - 1) / col_rows_per_chunk(N)) * C;
}

template <int K, typename Term, typename Finish>
void col_sums(int64_t N, int64_t C, Term term, Finish finish, float* partial, cudaStream_t s) {
  const int64_t rpc = col_rows_per_chunk(N);
  const int chunks = static_cast<int>((N + rpc - 1) / rpc);
  const dim3 grid(static_cast<unsigned>((C + kColTile - 1) / kColTile), static_cast<unsigned>(chunks));
  col_partials_kernel<K><<<grid, dim3(kColTile, kColRows), 0, s>>>(N, C, rpc, term, partial);
  HR_CUDA_CHECK_LAUNCH();
  col_finish_kernel<K><<<grid_for(C), kThreads, 0, s>>>(C, chunks, partial, finish);
  HR_CUDA_CHECK_LAUNCH();
}

}  // namespace hr::gpu
