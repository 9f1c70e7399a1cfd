// Attention core: argument checks, dispatch, the naive form (batched products and
// the masked softmax, on either backend) and the CPU memory-efficient form: per
// (b, h) and query row, keys in chunks of kKeyChunk with an online softmax, so no
// T x T buffer exists; the backward pass recomputes probabilities from the saved
// log-sum-exp (FlashAttention-2 with D_i = rowsum(dO * O)).
#include "kernels/attention/attention.hpp"

#include <algorithm>
#include <atomic>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>

#include "harness/check.hpp"
#include "harness/kernel_calls.hpp"
#include "kernels/attention/attention_math.hpp"
#include "kernels/common/dispatch.hpp"
#include "kernels/common/dtype_dispatch.hpp"
#include "kernels/common/op_fault.hpp"
#include "kernels/common/widen.hpp"
#include "kernels/matmul/matmul.hpp"
#include "kernels/softmax/softmax_math.hpp"

#if HEADROOM_HAVE_CUDA
#include "kernels/attention/attention_cuda.hpp"
#endif

namespace hr::ops {

const char* attention_impl_name(AttentionImpl a) {
  return a == AttentionImpl::naive ? "naive" : "memory_efficient";
}

const char* gpu_attention_kernel_name(GpuAttentionKernel k) {
  switch (k) {
    case GpuAttentionKernel::scalar: return "scalar";
    case GpuAttentionKernel::tensor_core: return "tensor_core";
    case GpuAttentionKernel::cudnn: return "cudnn";
  }
  return "?";
}

std::optional<GpuAttentionKernel> parse_gpu_attention_kernel(const std::string& name) {
  for (GpuAttentionKernel k : {GpuAttentionKernel::scalar, GpuAttentionKernel::tensor_core, GpuAttentionKernel::cudnn})
    if (name == gpu_attention_kernel_name(k)) return k;
  return std::nullopt;
}

namespace {
// The kernels in use, and whether that is still the default (neither the environment
// nor a caller chose). The environment is read once, at the first use.
struct KernelSetting {
  std::atomic<GpuAttentionKernel> kernel{GpuAttentionKernel::tensor_core};
  std::atomic<bool> is_default{true};
  KernelSetting() {
    const char* env = std::getenv("HEADROOM_ATTENTION_KERNEL");
    if (env == nullptr || *env == '\0') return;
    const std::string v = env;
    const std::optional<GpuAttentionKernel> k = parse_gpu_attention_kernel(v);
    HR_ARG_CHECK(k.has_value(), "HEADROOM_ATTENTION_KERNEL must be scalar, tensor_core or cudnn, got '{}'", v);
    kernel = *k;
    is_default = false;
  }
};

KernelSetting& gpu_kernel_setting() {
  static KernelSetting setting;
  return setting;
}
}  // namespace

GpuAttentionKernel gpu_attention_kernel() { return gpu_kernel_setting().kernel.load(); }

bool gpu_attention_kernel_available(Device& dev, GpuAttentionKernel kernel, DType dt, int64_t D, std::string* why) {
  if (kernel == GpuAttentionKernel::scalar) return true;
  auto no = [why](std::string reason) {
    if (why != nullptr) *why = std::move(reason);
    return false;
  };
#if HEADROOM_HAVE_CUDA
  if (!dev.is_cuda()) return no(fmt::format("{} is not a CUDA device", dev.record().name));
  const Tensor probe = Tensor::zeros(dev, {1, 1, 8, D}, dt, Consumer::workspace);
  return kernel == GpuAttentionKernel::tensor_core ? cuda::tensor_core_attention_available(probe, why)
                                                   : cuda::cudnn_attention_available(probe, AttnMask{}, why);
#else
  (void)dev, (void)dt, (void)D;
  return no("built without the CUDA backend");
#endif
}
void restore_gpu_attention_kernel(GpuAttentionKernel k, bool is_default) {
  gpu_kernel_setting().kernel.store(k);
  gpu_kernel_setting().is_default.store(is_default);
}

void set_gpu_attention_kernel(GpuAttentionKernel k) { restore_gpu_attention_kernel(k, false); }

bool gpu_attention_kernel_is_default() { return gpu_kernel_setting().is_default.load(); }

namespace {

constexpr int64_t kKeyChunk = 64;  // keys per online-softmax step on the CPU

struct Dims {
  int64_t B, H, T, D;
};

Dims check_qkv(const char* op, const Tensor& q, const Tensor& k, const Tensor& v, const AttnMask& mask) {
  HR_CHECK(q.defined() && k.defined() && v.defined(), "{}: undefined q, k or v", op);
  HR_CHECK(q.ndim() == 4 && is_float(q.dtype()), "{}: q must be a float [B, H, T, D], got {}", op, q.str());
  for (const Tensor* t : {&k, &v}) {
    check_same_shape(*t, q, op);
    check_same_device(*t, q, op);
    HR_CHECK(t->dtype() == q.dtype(), "{}: {} must have the dtype of q {}", op, t->str(), q.str());
  }
  const Dims d{q.dim(0), q.dim(1), q.dim(2), q.dim(3)};
  if (mask.key_valid_len.defined()) {
    HR_CHECK(mask.key_valid_len.dtype() == DType::i32 && mask.key_valid_len.numel() == d.B,
             "{}: key_valid_len must be int32 [{}], got {}", op, d.B, mask.key_valid_len.str());
    check_same_device(q, mask.key_valid_len, op);
  }
  if (mask.segment_ids.defined()) {
    HR_CHECK(mask.segment_ids.dtype() == DType::i32 && mask.segment_ids.numel() == d.B * d.T,
             "{}: segment_ids must be int32 [{}, {}], got {}", op, d.B, d.T, mask.segment_ids.str());
    check_same_device(q, mask.segment_ids, op);
  }
  HR_CHECK(d.T < INT32_MAX, "{}: sequence length {} beyond int32", op, d.T);
  return d;
}

void check_like_q(const char* op, const Tensor& t, const Tensor& q) {
  HR_CHECK(t.defined(), "{}: undefined tensor where {} is expected", op, q.str());
  check_same_shape(t, q, op);
  check_same_device(t, q, op);
  HR_CHECK(t.dtype() == q.dtype(), "{}: {} must have the dtype of q {}", op, t.str(), q.str());
}

// Mask of query row t of batch row b, resolved once per row (host pointers).
sm::RowMask row_mask(const AttnMask& mask, int64_t b, int64_t t, int64_t T) {
  const int32_t* kvl = mask.key_valid_len.defined() ? mask.key_valid_len.data_as<int32_t>() : nullptr;
  const int32_t* seg = mask.segment_ids.defined() ? mask.segment_ids.data_as<int32_t>() : nullptr;
  return sm::RowMask{mask.causal, static_cast<int32_t>(t), kvl ? kvl[b] : INT32_MAX, seg ? seg + b * T : nullptr};
}

// Rows [T, D] of one (b, h) widened to fp32.
template <typename S>
void widen_rows(const Tensor& x, int64_t bh, int64_t T, int64_t D, float* dst) {
  widen_floats(x.data_as<S>() + bh * T * D, dst, T * D);
}

float dot(const float* a, const float* b, int64_t n) {
  float s = 0.f;
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

// ---- memory-efficient, CPU ---------------------------------------------------------

template <typename S>
void mem_efficient_forward_cpu(const Dims& d, const Tensor& q, const Tensor& k, const Tensor& v,
                               const AttnMask& mask, float scale, Tensor& out, Tensor& lse) {
  Device& dev = q.device();
  // O(T D) workspace per call: one (b, h)'s q, k, v in fp32 and one row's output.
  Tensor ws = Tensor::empty(dev, {3 * d.T * d.D + d.D}, DType::f32, Consumer::workspace);
  float* qf = ws.data_as<float>();
  float* kf = qf + d.T * d.D;
  float* vf = kf + d.T * d.D;
  float* acc = vf + d.T * d.D;
  S* op = out.data_as<S>();
  float* lp = lse.data_as<float>();
  float sc[kKeyChunk];
  bool ok[kKeyChunk];
  for (int64_t bh = 0; bh < d.B * d.H; ++bh) {
    const int64_t b = bh / d.H;
    widen_rows<S>(q, bh, d.T, d.D, qf);
    widen_rows<S>(k, bh, d.T, d.D, kf);
    widen_rows<S>(v, bh, d.T, d.D, vf);
    for (int64_t t = 0; t < d.T; ++t) {
      const sm::RowMask rm = row_mask(mask, b, t, d.T);
      const float* qt = qf + t * d.D;
      float m = -INFINITY, l = 0.f;
      std::fill(acc, acc + d.D, 0.f);
      for (int64_t s0 = 0; s0 < d.T; s0 += kKeyChunk) {
        if (mask.causal && s0 > t) break;  // every later key is in the future
        const int64_t n = std::min(kKeyChunk, d.T - s0);
        float chunk_max = -INFINITY;
        for (int64_t j = 0; j < n; ++j) {
          ok[j] = sm::allowed(rm, static_cast<int32_t>(s0 + j));
          if (!ok[j]) continue;
          sc[j] = scale * dot(qt, kf + (s0 + j) * d.D, d.D);
          chunk_max = std::fmax(chunk_max, sc[j]);
        }
        const float factor = attn::online_rescale(m, l, chunk_max);
        if (chunk_max == -INFINITY) continue;
        for (int64_t e = 0; e < d.D; ++e) acc[e] *= factor;
        for (int64_t j = 0; j < n; ++j) {
          if (!ok[j]) continue;
          const float p = attn::online_weight(sc[j], m);
          l += p;
          const float* vs = vf + (s0 + j) * d.D;
          for (int64_t e = 0; e < d.D; ++e) acc[e] += p * vs[e];
        }
      }
      const float inv = attn::inv_row_sum(l);
      S* ot = op + (bh * d.T + t) * d.D;
      for (int64_t e = 0; e < d.D; ++e) ot[e] = from_float<S>(acc[e] * inv);
      lp[bh * d.T + t] = attn::row_lse(m, l);
    }
  }
}

template <typename S>
void mem_efficient_backward_cpu(const Dims& d, const Tensor& q, const Tensor& k, const Tensor& v,
                                const Tensor& out, const Tensor& dout, const AttnMask& mask, float scale,
                                const Tensor& lse, Tensor& dq, Tensor& dk, Tensor& dv) {
  Device& dev = q.device();
  // O(T D) workspace: q, k, v, out, dout, dk, dv of one (b, h) in fp32, one dq row.
  const int64_t td = d.T * d.D;
  Tensor ws = Tensor::empty(dev, {7 * td + d.D}, DType::f32, Consumer::workspace);
  float* qf = ws.data_as<float>();
  float* kf = qf + td;
  float* vf = kf + td;
  float* of = vf + td;
  float* gf = of + td;
  float* dkf = gf + td;
  float* dvf = dkf + td;
  float* dqr = dvf + td;
  const float* lp = lse.data_as<float>();
  S* dqp = dq.data_as<S>();
  S* dkp = dk.data_as<S>();
  S* dvp = dv.data_as<S>();
  for (int64_t bh = 0; bh < d.B * d.H; ++bh) {
    const int64_t b = bh / d.H;
    widen_rows<S>(q, bh, d.T, d.D, qf);
    widen_rows<S>(k, bh, d.T, d.D, kf);
    widen_rows<S>(v, bh, d.T, d.D, vf);
    widen_rows<S>(out, bh, d.T, d.D, of);
    widen_rows<S>(dout, bh, d.T, d.D, gf);
    std::fill(dkf, dkf + 2 * td, 0.f);
    // One pass over (t, s): dq row t is complete after its keys; dk and dv gather
    // over every query in a fixed order, so the result is the same bytes each run.
    for (int64_t t = 0; t < d.T; ++t) {
      const sm::RowMask rm = row_mask(mask, b, t, d.T);
      const float* qt = qf + t * d.D;
      const float* gt = gf + t * d.D;
      const float lse_t = lp[bh * d.T + t];
      const float row_dot = dot(gt, of + t * d.D, d.D);
      std::fill(dqr, dqr + d.D, 0.f);
      const int64_t s_end = mask.causal ? std::min(d.T, t + 1) : d.T;
      for (int64_t s = 0; s < s_end; ++s) {
        if (!sm::allowed(rm, static_cast<int32_t>(s))) continue;
        const float* ks = kf + s * d.D;
        const float* vs = vf + s * d.D;
        const float p = attn::prob_from_lse(scale * dot(qt, ks, d.D), lse_t);
        const float ds = attn::dscore_unscaled(p, dot(gt, vs, d.D), row_dot);
        float* dks = dkf + s * d.D;
        float* dvs = dvf + s * d.D;
        for (int64_t e = 0; e < d.D; ++e) {
          dqr[e] += ds * ks[e];
          dks[e] += ds * qt[e];
          dvs[e] += p * gt[e];
        }
      }
      S* dqt = dqp + (bh * d.T + t) * d.D;
      for (int64_t e = 0; e < d.D; ++e) dqt[e] = from_float<S>(scale * dqr[e]);
    }
    for (int64_t i = 0; i < td; ++i) {
      dkp[bh * td + i] = from_float<S>(scale * dkf[i]);
      dvp[bh * td + i] = from_float<S>(dvf[i]);
    }
  }
}

// ---- naive (both backends) -----------------------------------------------------------

void naive_forward(const Dims& d, const Tensor& q, const Tensor& k, const Tensor& v, const AttnMask& mask,
                   float scale, Tensor& out, AttentionSaved& saved, Consumer saved_consumer,
                   const AttnProbDropout& drop) {
  Device& dev = q.device();
  const int64_t bh = d.B * d.H;
  saved.probs = Tensor::empty(dev, {d.B, d.H, d.T, d.T}, q.dtype(), saved_consumer);
  {
    Tensor scores = Tensor::empty(dev, {d.B, d.H, d.T, d.T}, q.dtype(), Consumer::workspace);
    Tensor s3 = scores.reshape({bh, d.T, d.T});
    matmul_batched(q.reshape({bh, d.T, d.D}), false, k.reshape({bh, d.T, d.D}), true, s3);
    softmax_forward(scores, mask, scale, saved.probs);
  }  // the raw scores are not kept
  Tensor o3 = out.reshape({bh, d.T, d.D});
  if (drop.enabled()) {  // O = drop(P) V; P itself is kept
    Tensor dropped = Tensor::empty(dev, {d.B, d.H, d.T, d.T}, q.dtype(), Consumer::workspace);
    drop.forward(saved.probs, dropped);
    matmul_batched(dropped.reshape({bh, d.T, d.T}), false, v.reshape({bh, d.T, d.D}), false, o3);
    return;
  }
  matmul_batched(saved.probs.reshape({bh, d.T, d.T}), false, v.reshape({bh, d.T, d.D}), false, o3);
}

void naive_backward(const Dims& d, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& dout,
                    const AttentionSaved& saved, float scale, Tensor& dq, Tensor& dk, Tensor& dv,
                    const AttnProbDropout& drop) {
  Device& dev = q.device();
  const int64_t bh = d.B * d.H;
  const Tensor p3 = saved.probs.reshape({bh, d.T, d.T});
  const Tensor g3 = dout.reshape({bh, d.T, d.D});
  Tensor dv3 = dv.reshape({bh, d.T, d.D});
  if (drop.enabled()) {  // dV = drop(P)^T dO, the mask replayed
    Tensor dropped = Tensor::empty(dev, {d.B, d.H, d.T, d.T}, q.dtype(), Consumer::workspace);
    drop.forward(saved.probs, dropped);
    matmul_batched(dropped.reshape({bh, d.T, d.T}), true, g3, false, dv3);
  } else {
    matmul_batched(p3, true, g3, false, dv3);  // dV = P^T dO
  }
  Tensor dscores = Tensor::empty(dev, {bh, d.T, d.T}, q.dtype(), Consumer::workspace);
  {
    Tensor dprobs = Tensor::empty(dev, {bh, d.T, d.T}, q.dtype(), Consumer::workspace);
    matmul_batched(g3, false, v.reshape({bh, d.T, d.D}), true, dprobs);  // dP = dO V^T
    if (drop.enabled()) {  // through the mask, in place
      Tensor dp4 = dprobs.reshape({d.B, d.H, d.T, d.T});
      drop.backward(dp4, dp4);
    }
    softmax_backward(p3, dprobs, scale, dscores);                         // dS (scale included)
  }
  Tensor dq3 = dq.reshape({bh, d.T, d.D});
  Tensor dk3 = dk.reshape({bh, d.T, d.D});
  matmul_batched(dscores, false, k.reshape({bh, d.T, d.D}), false, dq3);  // dQ = dS K
  matmul_batched(dscores, true, q.reshape({bh, d.T, d.D}), false, dk3);   // dK = dS^T Q
}

}  // namespace

static void attention_forward_computed(AttentionImpl impl, const Tensor& q, const Tensor& k, const Tensor& v,
                                       const AttnMask& mask, float scale, Tensor& out, AttentionSaved& saved,
                                       Consumer saved_consumer, const AttnProbDropout& drop) {
  const char* op = "attention_forward";
  const Dims d = check_qkv(op, q, k, v, mask);
  check_like_q(op, out, q);
  saved = AttentionSaved{};
  if (impl == AttentionImpl::naive) {
    count_kernel_call("attention_forward:naive");
    naive_forward(d, q, k, v, mask, scale, out, saved, saved_consumer, drop);
    return;
  }
  HR_ARG_CHECK(!drop.enabled(), "{}: dropout on the probabilities needs the naive form", op);
  saved.lse = Tensor::empty(q.device(), {d.B, d.H, d.T}, DType::f32, saved_consumer);
  HR_IF_CUDA(q, cuda::attention_mem_efficient_forward(q, k, v, mask, scale, out, saved.lse));
  count_kernel_call("attention_forward:cpu");
  dispatch_float(q.dtype(), op, [&](auto tag) {
    mem_efficient_forward_cpu<decltype(tag)>(d, q, k, v, mask, scale, out, saved.lse);
  });
}

namespace {
// The form a call runs: the one asked for, or the other under OpFault::swap_attention_forms.
AttentionImpl form_run(AttentionImpl asked) {
  const OpFault* f = op_fault("attention_forward");
  if (!f || !f->swap_attention_forms) return asked;
  return asked == AttentionImpl::naive ? AttentionImpl::memory_efficient : AttentionImpl::naive;
}
}  // namespace

void attention_forward(AttentionImpl impl, const Tensor& q, const Tensor& k, const Tensor& v, const AttnMask& mask,
                       float scale, Tensor& out, AttentionSaved& saved, Consumer saved_consumer,
                       const AttnProbDropout& drop) {
  const OpTimer timer(q, __func__);  // naive attention's products and softmax count here
  attention_forward_computed(form_run(impl), q, k, v, mask, scale, out, saved, saved_consumer, drop);
  apply_output_fault("attention_forward", out);
  const OpFault* f = op_fault("attention_forward");
  if (f && f->lse_offset != 0 && saved.lse.defined()) {
    std::vector<float> lse = saved.lse.to_host_f32();
    for (float& x : lse) x = static_cast<float>(x + f->lse_offset);
    saved.lse.copy_from(Tensor::from_host(saved.lse.device(), lse, saved.lse.shape(), DType::f32, Consumer::workspace));
  }
}

void attention_backward(AttentionImpl impl, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                        const Tensor& dout, const AttnMask& mask, float scale, const AttentionSaved& saved,
                        Tensor& dq, Tensor& dk, Tensor& dv, const AttnProbDropout& drop) {
  const char* op = "attention_backward";
  const OpTimer timer(q, op);  // naive attention's products and softmax count here
  impl = form_run(impl);
  const Dims d = check_qkv(op, q, k, v, mask);
  for (const Tensor* t : {&dout, static_cast<const Tensor*>(&dq), static_cast<const Tensor*>(&dk),
                          static_cast<const Tensor*>(&dv)})
    check_like_q(op, *t, q);
  if (impl == AttentionImpl::naive) {
    // (Shapes compared outside HR_CHECK: its condition text becomes part of a format string.)
    const Shape probs_shape{d.B, d.H, d.T, d.T};
    const bool probs_ok =
        saved.probs.defined() && saved.probs.shape() == probs_shape && saved.probs.dtype() == q.dtype();
    HR_CHECK(probs_ok,
             "{}: naive attention needs the saved probabilities [B, H, T, T] in {}", op, dtype_name(q.dtype()));
    count_kernel_call("attention_backward:naive");
    naive_backward(d, q, k, v, dout, saved, scale, dq, dk, dv, drop);
    return;
  }
  HR_ARG_CHECK(!drop.enabled(), "{}: dropout on the probabilities needs the naive form", op);
  check_like_q(op, out, q);
  const Shape lse_shape{d.B, d.H, d.T};
  const bool lse_ok = saved.lse.defined() && saved.lse.shape() == lse_shape && saved.lse.dtype() == DType::f32;
  HR_CHECK(lse_ok,
           "{}: memory-efficient attention needs the saved fp32 log-sum-exp [B, H, T]", op);
  check_same_device(saved.lse, q, op);
  HR_IF_CUDA(q, cuda::attention_mem_efficient_backward(q, k, v, out, dout, mask, scale, saved.lse, dq, dk, dv));
  count_kernel_call("attention_backward:cpu");
  dispatch_float(q.dtype(), op, [&](auto tag) {
    mem_efficient_backward_cpu<decltype(tag)>(d, q, k, v, out, dout, mask, scale, saved.lse, dq, dk, dv);
  });
}

// ---- head moves ----------------------------------------------------------------------

void split_heads(const Tensor& x, int64_t heads, Tensor& y) {
  HR_CHECK(x.defined() && y.defined() && x.ndim() == 3 && heads > 0 && x.dim(2) % heads == 0,
           "split_heads: x must be [B, T, H*D] with H = {} dividing the last dimension, got {}", heads,
           x.defined() ? x.str() : "undefined");
  const int64_t B = x.dim(0), T = x.dim(1), D = x.dim(2) / heads;
  const Shape y_shape{B, heads, T, D};
  const bool y_ok = y.shape() == y_shape && y.dtype() == x.dtype();
  HR_CHECK(y_ok, "split_heads: y {} for x {}", y.str(),
           x.str());
  check_same_device(x, y, "split_heads");
  HR_IF_CUDA(x, cuda::split_heads(x, heads, y));
  const size_t row = static_cast<size_t>(D) * dtype_size(x.dtype());
  const auto* src = static_cast<const char*>(x.data());
  auto* dst = static_cast<char*>(y.data());
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < heads; ++h)
        std::memcpy(dst + (((b * heads + h) * T + t) * row), src + ((b * T + t) * heads + h) * row, row);
}

void merge_heads(const Tensor& y, Tensor& x) {
  HR_CHECK(y.defined() && x.defined() && y.ndim() == 4, "merge_heads: y must be [B, H, T, D], got {}",
           y.defined() ? y.str() : "undefined");
  const int64_t B = y.dim(0), H = y.dim(1), T = y.dim(2), D = y.dim(3);
  const Shape x_shape{B, T, H * D};
  const bool x_ok = x.shape() == x_shape && x.dtype() == y.dtype();
  HR_CHECK(x_ok, "merge_heads: x {} for y {}", x.str(),
           y.str());
  check_same_device(x, y, "merge_heads");
  HR_IF_CUDA(y, cuda::merge_heads(y, x));
  const size_t row = static_cast<size_t>(D) * dtype_size(y.dtype());
  const auto* src = static_cast<const char*>(y.data());
  auto* dst = static_cast<char*>(x.data());
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < H; ++h)
        std::memcpy(dst + ((b * T + t) * H + h) * row, src + (((b * H + h) * T + t) * row), row);
}

}  // namespace hr::ops
