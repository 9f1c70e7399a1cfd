// Element-wise map kernels shared by the element-wise, GELU and similar ops (CUDA
// translation units only): out[i] = f(a[i]) or f(a[i], b[i]) with fp32 math,
// 16-byte packed loads and stores when every pointer allows it, a scalar
// grid-stride loop otherwise. f is a functor whose operator() is HR_HD.
#pragma once

#include "harness/cuda_check.cuh"
#include "kernels/common/cuda_launch.cuh"
#include "kernels/common/float16.hpp"

namespace hr::gpu {

// Elements per pack: 16 bytes of the widest type involved.
template <typename... Ts>
constexpr int pack_width() {
  size_t widest = 1;
  ((widest = sizeof(Ts) > widest ? sizeof(Ts) : widest), ...);
  return static_cast<int>(16 / widest);
}

template <int N, typename TO, typename TA, typename F>
__global__ void map1_kernel(TO* out, const TA* a, int64_t n, F f) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t packs = n / N;
  for (int64_t p = tid; p < packs; p += stride) {
    const Pack<TA, N> va = reinterpret_cast<const Pack<TA, N>*>(a)[p];
    Pack<TO, N> vo;
#pragma unroll
    for (int k = 0; k < N; ++k) vo.v[k] = from_float<TO>(f(to_float(va.v[k])));
    reinterpret_cast<Pack<TO, N>*>(out)[p] = vo;
  }
  for (int64_t i = packs * N + tid; i < n; i += stride) out[i] = from_float<TO>(f(to_float(a[i])));
}

template <int N, typename TO, typename TA, typename TB, typename F>
__global__ void map2_kernel(TO* out, const TA* a, const TB* b, int64_t n, F f) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t packs = n / N;
  for (int64_t p = tid; p < packs; p += stride) {
    const Pack<TA, N> va = reinterpret_cast<const Pack<TA, N>*>(a)[p];
    const Pack<TB, N> vb = reinterpret_cast<const Pack<TB, N>*>(b)[p];
    Pack<TO, N> vo;
#pragma unroll
    for (int k = 0; k < N; ++k) vo.v[k] = from_float<TO>(f(to_float(va.v[k]), to_float(vb.v[k])));
    reinterpret_cast<Pack<TO, N>*>(out)[p] = vo;
  }
  for (int64_t i = packs * N + tid; i < n; i += stride)
    out[i] = from_float<TO>(f(to_float(a[i]), to_float(b[i])));
}

// out may alias a (same element read, then written, by the same thread).
template <typename TO, typename TA, typename F>
void map1(TO* out, const TA* a, int64_t n, F f, cudaStream_t s) {
  if (n <= 0) return;
  constexpr int N = pack_width<TO, TA>();
  if (n >= N && aligned16(out) && aligned16(a)) {
    map1_kernel<N><<<grid_for(n / N), kThreads, 0, s>>>(out, a, n, f);
  } else {
    map1_kernel<1><<<grid_for(n), kThreads, 0, s>>>(out, a, n, f);
  }
  HR_CUDA_CHECK_LAUNCH();
}

// out may alias a or b.
template <typename TO, typename TA, typename TB, typename F>
void map2(TO* out, const TA* a, const TB* b, int64_t n, F f, cudaStream_t s) {
  if (n <= 0) return;
  constexpr int N = pack_width<TO, TA, TB>();
  if (n >= N && aligned16(out) && aligned16(a) && aligned16(b)) {
    map2_kernel<N><<<grid_for(n / N), kThreads, 0, s>>>(out, a, b, n, f);
  } else {
    map2_kernel<1><<<grid_for(n), kThreads, 0, s>>>(out, a, b, n, f);
  }
  HR_CUDA_CHECK_LAUNCH();
}

}  // namespace hr::gpu
