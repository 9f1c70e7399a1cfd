// Fused softmax cross-entropy: argument checks (targets range-checked on the host,
// from the caller's host copy when given), the reductions, backend dispatch and the
// CPU loops. Per-token losses are reduced on the host in double in token order, so
// the reduced loss is deterministic on both backends.
#include "kernels/crossentropy/crossentropy.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

#include "harness/check.hpp"
#include "kernels/common/cpu_rows.hpp"
#include "kernels/common/dispatch.hpp"
#include "kernels/common/dtype_dispatch.hpp"
#include "kernels/common/host_ints.hpp"
#include "kernels/common/op_fault.hpp"
#include "kernels/common/widen.hpp"
#include "kernels/crossentropy/crossentropy_math.hpp"
#if HEADROOM_HAVE_CUDA
#include "kernels/crossentropy/crossentropy_cuda.hpp"
#endif

namespace hr::ops {
namespace {

// Checks shapes and targets; returns the number of real (not ignored) tokens.
int64_t check_args(const Tensor& logits, const Tensor& targets, const CrossEntropyConfig& cfg, const char* op) {
  HR_CHECK(logits.defined() && logits.ndim() == 2 && is_float(logits.dtype()) && logits.dim(1) > 0,
           "{}: logits must be float [N, V], got {}", op, logits.str());
  HR_CHECK(targets.defined() && targets.dtype() == DType::i32 && targets.ndim() == 1 &&
               targets.dim(0) == logits.dim(0),
           "{}: targets must be int32 [{}], got {}", op, logits.dim(0), targets.str());
  check_same_device(logits, targets, op);
  if (cfg.reduction == LossReduction::sum_div_count)
    HR_ARG_CHECK(cfg.count > 0 && std::isfinite(cfg.count), "{}: sum_div_count needs count > 0, got {}", op,
                 cfg.count);
  HR_ARG_CHECK(std::isfinite(cfg.loss_scale) && cfg.loss_scale > 0, "{}: loss_scale must be finite and > 0, got {}",
               op, cfg.loss_scale);
  const HostInts t(targets, cfg.host_targets, op);
  const int64_t V = logits.dim(1);
  int64_t real = 0;
  for (size_t n = 0; n < t.size(); ++n) {
    if (t[n] == cfg.ignore_index) continue;
    HR_CHECK(t[n] >= 0 && t[n] < V, "{}: targets[{}] = {} outside [0, {}) and not the ignore index {}", op, n, t[n],
             V, cfg.ignore_index);
    ++real;
  }
  return real;
}

// 1 / the reduction's normaliser. A mean over zero real tokens is 0, not NaN (as
// PyTorch gives): a fully padded micro-batch then contributes nothing to an
// accumulated gradient instead of poisoning it.
double reduction_weight(const CrossEntropyConfig& cfg, int64_t real) {
  switch (cfg.reduction) {
    case LossReduction::mean: return real > 0 ? 1.0 / static_cast<double>(real) : 0.0;
    case LossReduction::sum: return 1.0;
    case LossReduction::sum_div_count: return 1.0 / cfg.count;
  }
  return 0;
}

// A row of logits in cpu_rows.hpp's padded float buffer (-inf past V).
template <typename T>
float* row_in_buffer(const T* x, int64_t V) {
  const int64_t n = rows::padded(V);
  float* e = rows::row_buffer(n);
  widen_floats(x, e, V);
  std::fill(e + V, e + n, -INFINITY);
  return e;
}

// Row log-sum-exp on the CPU: fp32 max, double sum of fp32 exponentials.
template <typename T>
float row_lse(const T* x, int64_t V) {
  const int64_t n = rows::padded(V);
  float* e = row_in_buffer(x, V);
  const float mx = rows::max_of(e, n);
  return ce::logsumexp(mx, static_cast<float>(rows::exp_shifted_sum(e, n, mx)));
}

template <typename T>
void losses_cpu(const Tensor& logits, const HostInts& t, int32_t ignore, float* losses) {
  const int64_t V = logits.dim(1);
  const T* xp = logits.data_as<T>();
  for (size_t n = 0; n < t.size(); ++n) {
    if (t[n] == ignore) {
      losses[n] = 0.f;
      continue;
    }
    const T* x = xp + static_cast<int64_t>(n) * V;
    losses[n] = ce::token_loss(row_lse(x, V), to_float(x[t[n]]));
  }
}

template <typename T, typename D>
void backward_cpu(const Tensor& logits, const HostInts& t, int32_t ignore, float weight, Tensor& dlogits) {
  const int64_t V = logits.dim(1);
  const T* xp = logits.data_as<T>();
  D* dp = dlogits.data_as<D>();
  for (size_t n = 0; n < t.size(); ++n) {
    const T* x = xp + static_cast<int64_t>(n) * V;
    D* d = dp + static_cast<int64_t>(n) * V;
    if (t[n] == ignore) {
      for (int64_t v = 0; v < V; ++v) d[v] = from_float<D>(0.f);
      continue;
    }
    const float lse = row_lse(x, V);
    // ce::dlogit, (expf(x - lse) - onehot) * weight, with the exponentials taken a row at a time.
    float* e = row_in_buffer(x, V);
    rows::exp_shifted_sum(e, rows::padded(V), lse);
    for (int64_t v = 0; v < V; ++v) d[v] = from_float<D>((e[v] - (v == t[n] ? 1.f : 0.f)) * weight);
  }
}

}  // namespace

LossValue cross_entropy_forward(const Tensor& logits, const Tensor& targets, const CrossEntropyConfig& cfg,
                                Tensor& losses) {
  const char* op = "cross_entropy_forward";
  const int64_t real = check_args(logits, targets, cfg, op);
  const OpTimer timer(logits, op);
  const int64_t N = logits.dim(0);
  if (losses.defined()) {
    HR_CHECK(losses.dtype() == DType::f32 && losses.numel() == N, "{}: losses must be fp32 [{}], got {}", op, N,
             losses.str());
    check_same_device(logits, losses, op);
  }
  if (logits.is_cuda()) {
#if HEADROOM_HAVE_CUDA
    Tensor buf = losses.defined() ? losses : Tensor::empty(logits.device(), {N}, DType::f32, Consumer::workspace);
    cuda::cross_entropy_losses(logits, targets, cfg.ignore_index, buf);
    apply_output_fault(op, buf);
    // Stream-ordered: buf may be freed at once, the copy is ahead of its reuse.
    return LossValue::pending_sum_of_floats(buf.device().read_back(buf.data(), buf.nbytes()), N,
                                            reduction_weight(cfg, real));
#else
    HR_CHECK(false, "{}: this build of headroom has no CUDA backend", op);
#endif
  }
  std::vector<float> host(static_cast<size_t>(N));
  const HostInts t(targets, cfg.host_targets, op);
  dispatch_float(logits.dtype(), op,
                 [&](auto tag) { losses_cpu<decltype(tag)>(logits, t, cfg.ignore_index, host.data()); });
  if (losses.defined()) {
    losses.from_host_bytes(host.data(), host.size() * sizeof(float));
    if (op_fault(op)) {  // the per-token losses broken, and so their sum
      apply_output_fault(op, losses);
      host = losses.to_host_f32();
    }
  }
  // Through the device's read-back as on a GPU (the CPU's lands at once): one path
  // for the step's pending losses, summed in token order by LossValue.
  return LossValue::pending_sum_of_floats(logits.device().read_back(host.data(), host.size() * sizeof(float)), N,
                                          reduction_weight(cfg, real));
}

void cross_entropy_backward(const Tensor& logits, const Tensor& targets, const CrossEntropyConfig& cfg,
                            Tensor& dlogits) {
  const char* op = "cross_entropy_backward";
  const int64_t real = check_args(logits, targets, cfg, op);
  check_same_shape(logits, dlogits, op);
  check_same_device(logits, dlogits, op);
  HR_CHECK(dlogits.dtype() == logits.dtype() || dlogits.dtype() == DType::f32,
           "{}: dlogits must be {} or fp32, got {}", op, dtype_name(logits.dtype()), dlogits.str());
  // loss_scale * weight in double, then rounded once: a power-of-two loss_scale
  // scales the rounded weight, hence every gradient, exactly.
  const float weight = static_cast<float>(static_cast<double>(cfg.loss_scale) * reduction_weight(cfg, real));
  if (logits.numel() == 0) return;
  HR_IF_CUDA(logits, cuda::cross_entropy_backward(logits, targets, cfg.ignore_index, weight, dlogits));
  const HostInts t(targets, cfg.host_targets, op);
  dispatch_float(logits.dtype(), op, [&](auto xt) {
    using T = decltype(xt);
    if (dlogits.dtype() == DType::f32)
      backward_cpu<T, float>(logits, t, cfg.ignore_index, weight, dlogits);
    else
      backward_cpu<T, T>(logits, t, cfg.ignore_index, weight, dlogits);
  });
}

int64_t count_real_tokens(const Tensor& targets, int32_t ignore_index, const std::vector<int32_t>* host_targets) {
  HR_CHECK(targets.defined() && targets.dtype() == DType::i32, "count_real_tokens: targets must be int32, got {}",
           targets.str());
  const HostInts t(targets, host_targets, "count_real_tokens");
  int64_t real = 0;
  for (size_t i = 0; i < t.size(); ++i) real += t[i] != ignore_index;
  return real;
}

}  // namespace hr::ops
