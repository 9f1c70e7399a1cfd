// The kernels of the CUDA optimizer steps (optim.cu): one grid-stride pass over the
// parameters, reading and writing parameter, gradient and state once each (the
// step is memory-bound), as 4-element packs when every pointer is aligned for them;
// and AdamW over many tensors in one launch. Include only from optim.cu, or after
// suites/common/warp_emulation.hpp, which runs the same kernels on emulated warps
// on a CPU (HR_WARP_EMULATION).
#pragma once

#include <cstdint>
#include <vector>

#include "harness/check.hpp"
#include "kernels/common/cuda_launch.cuh"
#include "kernels/common/float16.hpp"
#include "kernels/common/many_tensor_launch.hpp"
#include "kernels/common/dtype_dispatch.hpp"
#include "kernels/optim/optim_cuda.hpp"
#include "kernels/optim/optim_math.hpp"

// In an unnamed namespace, as kernels of one translation unit: the emulated
// kernels of a test binary must not share their names with the library's.
namespace hr::ops::cuda::optk {
namespace {

using gpu::kThreads;
using gpu::Pack;

template <typename T>
bool aligned_for(const void* p, int n) {
  return p == nullptr || reinterpret_cast<uintptr_t>(p) % (sizeof(T) * n) == 0;
}

template <int N, typename TP, typename TG>
__global__ void sgd_kernel(TP* param, const TG* grad, float* buf, int64_t n, optim::SgdScalars s) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t packs = n / N;
  for (int64_t q = tid; q < packs; q += stride) {
    Pack<TP, N> p = reinterpret_cast<Pack<TP, N>*>(param)[q];
    const Pack<TG, N> g = reinterpret_cast<const Pack<TG, N>*>(grad)[q];
    Pack<float, N> b{};
    if (s.use_momentum) b = reinterpret_cast<Pack<float, N>*>(buf)[q];
#pragma unroll
    for (int k = 0; k < N; ++k) p.v[k] = from_float<TP>(optim::sgd(to_float(p.v[k]), to_float(g.v[k]), &b.v[k], s));
    reinterpret_cast<Pack<TP, N>*>(param)[q] = p;
    if (s.use_momentum) reinterpret_cast<Pack<float, N>*>(buf)[q] = b;
  }
  for (int64_t i = packs * N + tid; i < n; i += stride) {
    float b = s.use_momentum ? buf[i] : 0.f;
    param[i] = from_float<TP>(optim::sgd(to_float(param[i]), to_float(grad[i]), &b, s));
    if (s.use_momentum) buf[i] = b;
  }
}

// AdamW on pack q of N elements, and on element i alone: the update both AdamW
// kernels below apply, so a tensor steps the same bit for bit in either.
template <int N, typename TP, typename TG>
__device__ __forceinline__ void adamw_pack(TP* param, const TG* grad, float* m, float* v, int64_t q,
                                           const optim::AdamWScalars& s) {
  Pack<TP, N> p = reinterpret_cast<Pack<TP, N>*>(param)[q];
  const Pack<TG, N> g = reinterpret_cast<const Pack<TG, N>*>(grad)[q];
  Pack<float, N> mm = reinterpret_cast<Pack<float, N>*>(m)[q];
  Pack<float, N> vv = reinterpret_cast<Pack<float, N>*>(v)[q];
#pragma unroll
  for (int k = 0; k < N; ++k)
    p.v[k] = from_float<TP>(optim::adamw(to_float(p.v[k]), to_float(g.v[k]), &mm.v[k], &vv.v[k], s));
  reinterpret_cast<Pack<TP, N>*>(param)[q] = p;
  reinterpret_cast<Pack<float, N>*>(m)[q] = mm;
  reinterpret_cast<Pack<float, N>*>(v)[q] = vv;
}

template <typename TP, typename TG>
__device__ __forceinline__ void adamw_element(TP* param, const TG* grad, float* m, float* v, int64_t i,
                                              const optim::AdamWScalars& s) {
  float mi = m[i], vi = v[i];
  param[i] = from_float<TP>(optim::adamw(to_float(param[i]), to_float(grad[i]), &mi, &vi, s));
  m[i] = mi;
  v[i] = vi;
}

template <int N, typename TP, typename TG>
__global__ void adamw_kernel(TP* param, const TG* grad, float* m, float* v, int64_t n, optim::AdamWScalars s) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t packs = n / N;
  for (int64_t q = tid; q < packs; q += stride) adamw_pack<N>(param, grad, m, v, q, s);
  for (int64_t i = packs * N + tid; i < n; i += stride) adamw_element(param, grad, m, v, i, s);
}

// Many tensors in one launch, for AdamW steps whose tensors are all 4-element
// aligned: each thread block takes a chunk of kAdamWChunk elements of one tensor (found
// by a binary search of the chunks' starts in the parameter bank), each thread 4
// consecutive elements at a time through adamw_pack (adamw_element for a tail), as
// the kernel above. Kept within the 4 KiB of kernel parameters every driver takes.
constexpr int kAdamWChunk = kThreads * 4 * 4;  // 4096 elements: four packs a thread
struct AdamWTensorArg {
  void* param;
  const void* grad;
  float* m;
  float* v;
  int64_t n;
  optim::AdamWScalars s;
};
constexpr int kAdamWMaxTensorsPerLaunch = 48;
using AdamWLaunch = gpu::ManyTensorLaunch<AdamWTensorArg, kAdamWMaxTensorsPerLaunch>;  // pieces: chunks
static_assert(sizeof(AdamWLaunch) <= 4096, "kernel parameters within 4 KiB");

template <typename TP, typename TG>
__global__ void __launch_bounds__(kThreads) adamw_multi_kernel(const __grid_constant__ AdamWLaunch L) {
  constexpr int N = 4;
  const int chunk = static_cast<int>(blockIdx.x), lo = gpu::tensor_of(L, chunk);
  // The tensor's arguments in registers (values, not references into the parameter bank).
  TP* const param = static_cast<TP*>(L.t[lo].param);
  const TG* const grad = static_cast<const TG*>(L.t[lo].grad);
  float* const m = L.t[lo].m;
  float* const v = L.t[lo].v;
  const int64_t n = L.t[lo].n;
  const optim::AdamWScalars s = L.t[lo].s;
  const int64_t begin = static_cast<int64_t>(chunk - L.start[lo]) * kAdamWChunk;
  const int64_t end = begin + kAdamWChunk < n ? begin + kAdamWChunk : n;
  for (int64_t i = begin + static_cast<int64_t>(threadIdx.x) * N; i < end; i += static_cast<int64_t>(blockDim.x) * N) {
    if (i + N <= end) {
      adamw_pack<N>(param, grad, m, v, i / N, s);
    } else {
      for (int64_t j = i; j < end; ++j) adamw_element(param, grad, m, v, j, s);
    }
  }
}

// Whether a tensor's four pointers are aligned for packs of 4: what the
// many-tensor launches take.
inline bool packs_of_4(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v) {
  bool ok = false;
  dispatch_float2(param.dtype(), grad.dtype(), "adamw_many_takes", [&](auto tp, auto tg) {
    using TP = decltype(tp);
    using TG = decltype(tg);
    ok = aligned_for<TP>(param.data(), 4) && aligned_for<TG>(grad.data(), 4) && aligned_for<float>(m.data(), 4) &&
         aligned_for<float>(v.data(), 4);
  });
  return ok;
}

// A many-tensor launch's arguments of one tensor.
inline AdamWTensorArg adamw_arg(const AdamWArgs& a) {
  return AdamWTensorArg{a.param->data(), a.grad->data(), a.m->data_as<float>(), a.v->data_as<float>(),
                        a.param->numel(), a.s};
}

// Packs tensors into as few launches of the many-tensor kernel as it takes.
template <typename Fn>
void for_each_adamw_launch(const std::vector<AdamWTensorArg>& ts, Fn&& launch) {
  gpu::for_each_launch<AdamWLaunch>(ts, kAdamWChunk, "adamw_step_many", launch);
}

}  // namespace
}  // namespace hr::ops::cuda::optk
