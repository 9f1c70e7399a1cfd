// CUDA optimizer steps: the launches of the kernels of optim_kernels.cuh.

#include "harness/cuda_check.cuh"
#include "kernels/common/cuda_launch.cuh"
#include "kernels/common/dtype_dispatch.hpp"
#include "kernels/optim/optim_cuda.hpp"
#include "kernels/optim/optim_kernels.cuh"

namespace hr::ops::cuda {

using namespace optk;
using gpu::kThreads;

bool adamw_many_takes(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v) {
  return packs_of_4(param, grad, m, v);
}

void adamw_step_many(const std::vector<AdamWArgs>& ts) {
  if (ts.empty()) return;
  const Tensor& first = *ts.front().param;
  const cudaStream_t stream = gpu::stream_of(first);
  for (const AdamWArgs& a : ts)
    HR_CHECK(&a.param->device() == &first.device() && a.param->dtype() == first.dtype() &&
                 a.grad->dtype() == ts.front().grad->dtype() && adamw_many_takes(*a.param, *a.grad, *a.m, *a.v),
             "adamw_step_many: the tensors of one launch must share device and dtypes and be 4-element aligned");
  dispatch_float2(first.dtype(), ts.front().grad->dtype(), "adamw_step_many", [&](auto tp, auto tg) {
    using TP = decltype(tp);
    using TG = decltype(tg);
    std::vector<AdamWTensorArg> args;
    for (const AdamWArgs& a : ts) args.push_back(adamw_arg(a));
    for_each_adamw_launch(args, [&](const AdamWLaunch& L) {
      adamw_multi_kernel<TP, TG><<<static_cast<unsigned>(L.start[L.count]), kThreads, 0, stream>>>(L);
      HR_CUDA_CHECK_LAUNCH();
    });
  });
}

int adamw_tensors_per_launch() { return kAdamWMaxTensorsPerLaunch; }

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
