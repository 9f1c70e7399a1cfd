// MSE loss: argument checks, dispatch and the CPU loops (double accumulation, a
// fixed order, so the loss is deterministic).
#include "kernels/mse/mse.hpp"

#include "harness/check.hpp"
#include "kernels/common/dispatch.hpp"
#include "kernels/common/float16.hpp"
#include "kernels/mse/mse_math.hpp"
#include "kernels/reduce/reduce.hpp"

#if HEADROOM_HAVE_CUDA
#include "kernels/mse/mse_cuda.hpp"
#endif

namespace hr::ops {
namespace {

double normaliser(const MseConfig& cfg, int64_t numel) {
  switch (cfg.reduction) {
    case LossReduction::mean: return static_cast<double>(numel);
    case LossReduction::sum: return 1.0;
    case LossReduction::sum_div_count: return cfg.count;
  }
  return 1.0;
}

void check_args(const Tensor& pred, const Tensor& target, const MseConfig& cfg, const char* op) {
  check_same_shape(pred, target, op);
  check_same_device(pred, target, op);
  HR_CHECK(is_float(pred.dtype()) && is_float(target.dtype()), "{}: float tensors expected: {} and {}", op,
           pred.str(), target.str());
  HR_CHECK(cfg.reduction != LossReduction::sum_div_count || cfg.count > 0,
           "{}: sum_div_count needs a positive count, got {}", op, cfg.count);
}

template <typename T>
float load(const void* p, int64_t i) {
  return to_float(static_cast<const T*>(p)[i]);
}

float load_any(const Tensor& t, int64_t i) {
  switch (t.dtype()) {
    case DType::f16: return load<half_t>(t.data(), i);
    case DType::bf16: return load<bfloat16_t>(t.data(), i);
    default: return load<float>(t.data(), i);
  }
}

template <typename T>
void backward_cpu(const Tensor& pred, const Tensor& target, float factor, Tensor& dpred) {
  T* out = dpred.data_as<T>();
  const int64_t n = pred.numel();
  for (int64_t i = 0; i < n; ++i) out[i] = from_float<T>(mse_elem_grad(load_any(pred, i), load_any(target, i), factor));
}

}  // namespace

LossValue mse_forward(const Tensor& pred, const Tensor& target, const MseConfig& cfg) {
  check_args(pred, target, cfg, "mse_forward");
  const OpTimer timer(pred, __func__);
  const double norm = normaliser(cfg, pred.numel());
#if HEADROOM_HAVE_CUDA
  if (pred.is_cuda()) {
    Tensor losses = Tensor::empty(pred.device(), {pred.numel()}, DType::f32, Consumer::workspace);
    cuda::mse_elementwise(pred, target, losses);
    return sum_deferred(losses, norm);
  }
#else
  HR_CHECK(!pred.is_cuda(), "mse_forward: this build of headroom has no CUDA backend");
#endif
  double acc = 0;
  const int64_t n = pred.numel();
  for (int64_t i = 0; i < n; ++i) acc += mse_elem_loss(load_any(pred, i), load_any(target, i));
  // Through the device's read-back as on a GPU (the CPU's lands at once).
  return LossValue::pending_quotient(pred.device().read_back(&acc, sizeof acc), norm);
}

void mse_backward(const Tensor& pred, const Tensor& target, const MseConfig& cfg, Tensor& dpred) {
  check_args(pred, target, cfg, "mse_backward");
  check_same_shape(pred, dpred, "mse_backward");
  check_same_device(pred, dpred, "mse_backward");
  HR_CHECK(dpred.dtype() == pred.dtype() || dpred.dtype() == DType::f32,
           "mse_backward: dpred must have the dtype of pred or fp32: {}", dpred.str());
  const float factor = static_cast<float>(static_cast<double>(cfg.loss_scale) / normaliser(cfg, pred.numel()));
  HR_IF_CUDA(pred, cuda::mse_backward(pred, target, factor, dpred));
  switch (dpred.dtype()) {
    case DType::f16: backward_cpu<half_t>(pred, target, factor, dpred); break;
    case DType::bf16: backward_cpu<bfloat16_t>(pred, target, factor, dpred); break;
    default: backward_cpu<float>(pred, target, factor, dpred); break;
  }
}

}  // namespace hr::ops
