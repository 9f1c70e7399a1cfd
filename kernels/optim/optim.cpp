// Optimizer steps: checks, the per-step scalars (bias corrections in double on the
// host, once per step), dispatch, and the CPU loops over optim_math.hpp.
#include "kernels/optim/optim.hpp"

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "kernels/common/cpu_vector_math.hpp"
#include "kernels/common/dispatch.hpp"
#include "kernels/optim/optim_many.hpp"
#include "kernels/common/dtype_dispatch.hpp"
#include "kernels/optim/optim_math.hpp"

#if HEADROOM_HAVE_CUDA
#include "kernels/optim/optim_cuda.hpp"
#endif

namespace hr::ops {
namespace {

void check_state(const Tensor& param, const Tensor& state, const char* op, const char* what) {
  HR_CHECK(state.defined(), "{}: {} is undefined", op, what);
  check_same_shape(param, state, op);
  check_same_device(param, state, op);
  HR_CHECK(state.dtype() == DType::f32, "{}: {} must be fp32, got {}", op, what, state.str());
}

void check_param_grad(const Tensor& param, const Tensor& grad, const char* op) {
  HR_CHECK(param.defined() && grad.defined(), "{}: undefined tensor", op);
  HR_CHECK(is_float(param.dtype()) && is_float(grad.dtype()), "{}: float tensors expected: {}, {}", op,
           param.str(), grad.str());
  check_same_shape(param, grad, op);
  check_same_device(param, grad, op);
}

}  // namespace

void sgd_step(Tensor& param, const Tensor& grad, Tensor& momentum_buf, const SgdConfig& cfg) {
  check_param_grad(param, grad, "sgd_step");
  HR_ARG_CHECK(cfg.lr >= 0.f && cfg.momentum >= 0.f && cfg.weight_decay >= 0.f,
               "sgd_step: lr {}, momentum {} and weight decay {} must be >= 0", cfg.lr, cfg.momentum,
               cfg.weight_decay);
  const optim::SgdScalars s{cfg.lr, cfg.momentum, cfg.weight_decay, cfg.momentum != 0.f};
  if (s.use_momentum) check_state(param, momentum_buf, "sgd_step", "momentum buffer");
  HR_IF_CUDA(param, cuda::sgd_step(param, grad, momentum_buf, s));
  dispatch_float2(param.dtype(), grad.dtype(), "sgd_step", [&](auto tp, auto tg) {
    using TP = decltype(tp);
    using TG = decltype(tg);
    TP* p = param.data_as<TP>();
    const TG* g = grad.data_as<TG>();
    float* buf = s.use_momentum ? momentum_buf.data_as<float>() : nullptr;
    float unused = 0.f;
    for (int64_t i = 0, n = param.numel(); i < n; ++i)
      p[i] = from_float<TP>(optim::sgd(to_float(p[i]), to_float(g[i]), buf ? buf + i : &unused, s));
  });
}

namespace {

// fp32 AdamW on its own, so that it vectorises (cpu_vector_math.hpp): the same
// optim::adamw per element. This file is compiled without errno from sqrtf (so it
// becomes one instruction) and without contracting a * b + c into an FMA, so the
// x86-64-v3 clone rounds as the baseline and as 8-bit AdamW's scalar loop do.
HR_CPU_CLONES void adamw_f32(float* __restrict p, const float* __restrict g, float* __restrict m, float* __restrict v,
                             int64_t n, const optim::AdamWScalars& s) {
  const optim::AdamWScalars c = s;  // a local copy: not aliased by the stores
  for (int64_t i = 0; i < n; ++i) p[i] = optim::adamw(p[i], g[i], m + i, v + i, c);
}

}  // namespace

namespace {

// adamw_step's checks; its per-step scalars.
optim::AdamWScalars checked_adamw(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v,
                                  int64_t step, const AdamWConfig& cfg, const char* op) {
  check_param_grad(param, grad, op);
  check_state(param, m, op, "first moment");
  check_state(param, v, op, "second moment");
  HR_ARG_CHECK(step >= 1, "{}: step is 1-based, got {}", op, step);
  HR_ARG_CHECK(cfg.beta1 >= 0.f && cfg.beta1 < 1.f && cfg.beta2 >= 0.f && cfg.beta2 < 1.f && cfg.eps > 0.f,
               "{}: betas ({}, {}) must be in [0, 1) and eps {} > 0", op, cfg.beta1, cfg.beta2, cfg.eps);
  return optim::adamw_scalars(cfg.lr, cfg.beta1, cfg.beta2, cfg.eps, cfg.weight_decay, step);
}

// adamw_step_many's checks of every tensor; each tensor's per-step scalars.
std::vector<optim::AdamWScalars> checked_many(const std::vector<AdamWTensor>& tensors, int64_t step) {
  std::vector<optim::AdamWScalars> scalars;
  for (const AdamWTensor& t : tensors) {
    HR_CHECK(t.param && t.grad && t.m && t.v, "adamw_step_many: a null tensor");
    scalars.push_back(checked_adamw(*t.param, *t.grad, *t.m, *t.v, step, t.cfg, "adamw_step_many"));
  }
  optim_many::check_listed_once(tensors, "adamw_step_many");
  return scalars;
}

}  // namespace

void adamw_check_many(const std::vector<AdamWTensor>& tensors, int64_t step) { checked_many(tensors, step); }

void adamw_step_many(const std::vector<AdamWTensor>& tensors, int64_t step) {
  if (tensors.empty()) return;
  const std::vector<optim::AdamWScalars> scalars = checked_many(tensors, step);  // each tensor's
  const OpTimer timer(*tensors.front().param, __func__);
  std::vector<bool> stepped(tensors.size(), false);
#if HEADROOM_HAVE_CUDA
  // The groups one launch can take, in the order their first tensor comes.
  struct Group {
    const Device* device;
    DType param, grad;
    std::vector<cuda::AdamWArgs> args;
    std::vector<size_t> index;
  };
  std::vector<Group> groups;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const AdamWTensor& t = tensors[i];
    if (!t.param->is_cuda() || !cuda::adamw_many_takes(*t.param, *t.grad, *t.m, *t.v)) continue;
    auto g = std::find_if(groups.begin(), groups.end(), [&](const Group& x) {
      return x.device == &t.param->device() && x.param == t.param->dtype() && x.grad == t.grad->dtype();
    });
    if (g == groups.end()) g = groups.insert(groups.end(), Group{&t.param->device(), t.param->dtype(), t.grad->dtype(), {}, {}});
    g->args.push_back({t.param, t.grad, t.m, t.v, scalars[i]});
    g->index.push_back(i);
  }
  for (const Group& g : groups) {
    cuda::adamw_step_many(g.args);
    for (size_t i : g.index) stepped[i] = true;
  }
#endif
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (stepped[i]) continue;
    const AdamWTensor& t = tensors[i];
    adamw_step(*t.param, *t.grad, *t.m, *t.v, step, t.cfg);
  }
}

void adamw_step(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, int64_t step, const AdamWConfig& cfg) {
  const optim::AdamWScalars s = checked_adamw(param, grad, m, v, step, cfg, "adamw_step");
  HR_IF_CUDA(param, cuda::adamw_step(param, grad, m, v, s));
  dispatch_float2(param.dtype(), grad.dtype(), "adamw_step", [&](auto tp, auto tg) {
    using TP = decltype(tp);
    using TG = decltype(tg);
    TP* p = param.data_as<TP>();
    const TG* g = grad.data_as<TG>();
    float* pm = m.data_as<float>();
    float* pv = v.data_as<float>();
    if constexpr (std::is_same_v<TP, float> && std::is_same_v<TG, float>)
      return adamw_f32(p, g, pm, pv, param.numel(), s);
    for (int64_t i = 0, n = param.numel(); i < n; ++i)
      p[i] = from_float<TP>(optim::adamw(to_float(p[i]), to_float(g[i]), pm + i, pv + i, s));
  });
}

}  // namespace hr::ops
