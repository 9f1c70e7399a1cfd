// CUDA optimizer steps: one grid-stride pass over the parameters, reading and
// writing parameter, gradient and state once each (the step is memory-bound), as
// 4-element packs when every pointer is aligned for them.
#include "harness/cuda_check.cuh"
#include "kernels/common/cuda_launch.cuh"
#include "kernels/common/dtype_dispatch.hpp"
#include "kernels/optim/optim_cuda.hpp"

namespace hr::ops::cuda {
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

template <int N, typename TP, typename TG>
__global__ void adamw_kernel(TP* param, const TG* grad, float* m, float* v, int64_t n, optim::AdamWScalars s) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t packs = n / N;
  for (int64_t q = tid; q < packs; q += stride) {
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
  for (int64_t i = packs * N + tid; i < n; i += stride) {
    float mi = m[i], vi = v[i];
    param[i] = from_float<TP>(optim::adamw(to_float(param[i]), to_float(grad[i]), &mi, &vi, s));
    m[i] = mi;
    v[i] = vi;
  }
}

}  // namespace

void sgd_step(Tensor& param, const Tensor& grad, Tensor& momentum_buf, const optim::SgdScalars& s) {
  const int64_t n = param.numel();
  if (n == 0) return;
  dispatch_float2(param.dtype(), grad.dtype(), "sgd_step", [&](auto tp, auto tg) {
    using TP = decltype(tp);
    using TG = decltype(tg);
    constexpr int N = 4;
    TP* p = param.data_as<TP>();
    const TG* g = grad.data_as<TG>();
    float* buf = s.use_momentum ? momentum_buf.data_as<float>() : nullptr;
    const cudaStream_t st = gpu::stream_of(param);
    if (aligned_for<TP>(p, N) && aligned_for<TG>(g, N) && aligned_for<float>(buf, N)) {
      sgd_kernel<N><<<gpu::grid_for(n / N + 1), kThreads, 0, st>>>(p, g, buf, n, s);
    } else {
      sgd_kernel<1><<<gpu::grid_for(n), kThreads, 0, st>>>(p, g, buf, n, s);
    }
    HR_CUDA_CHECK_LAUNCH();
  });
}

void adamw_step(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const optim::AdamWScalars& s) {
  const int64_t n = param.numel();
  if (n == 0) return;
  dispatch_float2(param.dtype(), grad.dtype(), "adamw_step", [&](auto tp, auto tg) {
    using TP = decltype(tp);
    using TG = decltype(tg);
    constexpr int N = 4;
    TP* p = param.data_as<TP>();
    const TG* g = grad.data_as<TG>();
    float* pm = m.data_as<float>();
    float* pv = v.data_as<float>();
    const cudaStream_t st = gpu::stream_of(param);
    if (aligned_for<TP>(p, N) && aligned_for<TG>(g, N) && aligned_for<float>(pm, N) && aligned_for<float>(pv, N)) {
      adamw_kernel<N><<<gpu::grid_for(n / N + 1), kThreads, 0, st>>>(p, g, pm, pv, n, s);
    } else {
      adamw_kernel<1><<<gpu::grid_for(n), kThreads, 0, st>>>(p, g, pm, pv, n, s);
    }
    HR_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace hr::ops::cuda
