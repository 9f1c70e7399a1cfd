// Reductions and the loss scaler's unscale-and-check: checks, dispatch and the CPU
// loops. Sums accumulate in double over eight interleaved partial sums (a fixed
// order, so deterministic, and independent lanes the compiler can vectorise).
#include "kernels/reduce/reduce.hpp"

#include "harness/op_profile.hpp"
#include "kernels/common/dispatch.hpp"
#include "kernels/common/dtype_dispatch.hpp"
#include "kernels/reduce/reduce_math.hpp"

#if HEADROOM_HAVE_CUDA
#include "kernels/reduce/reduce_cuda.hpp"
#endif

namespace hr::ops {
namespace {

void check_input(const Tensor& x, const char* op) {
  HR_CHECK(x.defined(), "{}: undefined tensor", op);
  HR_CHECK(is_float(x.dtype()), "{}: {} is not a float tensor", op, x.str());
}

template <typename T, typename Term>
double sum_cpu(const Tensor& x, Term term) {
  constexpr int kLanes = 8;
  const T* p = x.data_as<T>();
  const int64_t n = x.numel(), body = n / kLanes * kLanes;
  double lane[kLanes] = {};
  for (int64_t i = 0; i < body; i += kLanes)
    for (int k = 0; k < kLanes; ++k) lane[k] += term(to_float(p[i + k]));
  for (int64_t i = body; i < n; ++i) lane[i - body] += term(to_float(p[i]));
  double total = 0;
  for (double v : lane) total += v;
  return total;
}

}  // namespace

double sum(const Tensor& x) {
  check_input(x, "sum");
  const OpTimer timer(x, __func__);
#if HEADROOM_HAVE_CUDA
  if (x.is_cuda()) return cuda::sum(x);
#else
  HR_CHECK(!x.is_cuda(), "sum: this build of headroom has no CUDA backend");
#endif
  return dispatch_float(x.dtype(), "sum", [&](auto tag) { return sum_cpu<decltype(tag)>(x, reduce::Identity{}); });
}

LossValue sum_deferred(const Tensor& x, double divisor) {
  check_input(x, "sum");
  const OpTimer timer(x, __func__);
#if HEADROOM_HAVE_CUDA
  if (x.is_cuda()) return cuda::sum_deferred(x, divisor);
#endif
  // Through the device's read-back as on a GPU (the CPU's lands at once).
  const double total = sum(x);
  return LossValue::pending_quotient(x.device().read_back(&total, sizeof total), divisor);
}

double squared_norm(const Tensor& x) {
  check_input(x, "squared_norm");
  const OpTimer timer(x, __func__);
#if HEADROOM_HAVE_CUDA
  if (x.is_cuda()) return cuda::squared_norm(x);
#else
  HR_CHECK(!x.is_cuda(), "squared_norm: this build of headroom has no CUDA backend");
#endif
  return dispatch_float(x.dtype(), "squared_norm",
                        [&](auto tag) { return sum_cpu<decltype(tag)>(x, reduce::Square{}); });
}

bool any_nonfinite(const Tensor& x) {
  check_input(x, "any_nonfinite");
  const OpTimer timer(x, __func__);
#if HEADROOM_HAVE_CUDA
  if (x.is_cuda()) return cuda::any_nonfinite(x);
#else
  HR_CHECK(!x.is_cuda(), "any_nonfinite: this build of headroom has no CUDA backend");
#endif
  return dispatch_float(x.dtype(), "any_nonfinite", [&](auto tag) {
    using T = decltype(tag);
    const T* p = x.data_as<T>();
    bool found = false;
    for (int64_t i = 0, n = x.numel(); i < n; ++i) found |= reduce::nonfinite(to_float(p[i]));
    return found;
  });
}

bool unscale_and_check(Tensor& g, float inv_scale) {
  check_input(g, "unscale_and_check");
  const OpTimer timer(g, __func__);
#if HEADROOM_HAVE_CUDA
  if (g.is_cuda()) return cuda::unscale_and_check(g, inv_scale);
#else
  HR_CHECK(!g.is_cuda(), "unscale_and_check: this build of headroom has no CUDA backend");
#endif
  return dispatch_float(g.dtype(), "unscale_and_check", [&](auto tag) {
    using T = decltype(tag);
    T* p = g.data_as<T>();
    bool found = false;
    for (int64_t i = 0, n = g.numel(); i < n; ++i) {
      const float v = to_float(p[i]);
      found |= reduce::nonfinite(v);
      p[i] = from_float<T>(v * inv_scale);
    }
    return found;
  });
}

bool unscale_and_check_all(const std::vector<Tensor*>& grads, float inv_scale) {
  if (grads.empty()) return false;
  for (const Tensor* g : grads) {
    HR_CHECK(g != nullptr, "unscale_and_check_all: null tensor");
    check_input(*g, "unscale_and_check_all");
    // One device: the GPU's kernels raise one flag on the first tensor's stream.
    check_same_device(*g, *grads.front(), "unscale_and_check_all");
  }
  const OpTimer timer(*grads.front(), __func__);
#if HEADROOM_HAVE_CUDA
  if (grads.front()->is_cuda()) return cuda::unscale_and_check_all(grads, inv_scale);
#else
  HR_CHECK(!grads.front()->is_cuda(), "unscale_and_check_all: this build of headroom has no CUDA backend");
#endif
  bool found = false;
  for (Tensor* g : grads) found = unscale_and_check(*g, inv_scale) || found;  // host: no synchronisation
  return found;
}

}  // namespace hr::ops
