// 8-bit optimizer state: checks, dispatch, and the CPU loops over
// quant8_math.hpp, one quantisation block at a time (absmax first, then codes).
#include "kernels/optim/optim8.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/common/dispatch.hpp"
#include "kernels/optim/optim_many.hpp"
#include "kernels/common/dtype_dispatch.hpp"

#if HEADROOM_HAVE_CUDA
#include "kernels/optim/optim8_cuda.hpp"
#endif

HR_DEFINE_FAULT_SLOT(hr::ops::Q8Fault)

namespace hr::ops {
namespace {

// Each map is built once (its values do not change) and shared by both backends.
// Q8Fault::linear_maps reads a dynamic map as the linear one of its sign.
const q8::Codebook& codebook(q8::MapKind kind) {
  if (const Q8Fault* f = faults::active<Q8Fault>(); f && f->linear_maps) {
    if (kind == q8::MapKind::dynamic_signed) kind = q8::MapKind::linear_signed;
    if (kind == q8::MapKind::dynamic_unsigned) kind = q8::MapKind::linear_unsigned;
  }
  static const q8::Codebook maps[] = {q8::make_codebook(q8::MapKind::dynamic_signed),
                                      q8::make_codebook(q8::MapKind::dynamic_unsigned),
                                      q8::make_codebook(q8::MapKind::linear_signed),
                                      q8::make_codebook(q8::MapKind::linear_unsigned)};
  return maps[static_cast<int>(kind)];
}

void check_quantised(const Tensor& like, const Tensor& codes, const Tensor& absmax, int64_t block_size,
                     const char* op) {
  HR_ARG_CHECK(block_size > 0, "{}: block size must be positive, got {}", op, block_size);
  HR_CHECK(codes.defined() && absmax.defined(), "{}: undefined state", op);
  HR_CHECK(codes.dtype() == DType::u8 && codes.numel() == like.numel(), "{}: codes must be uint8 of {} elements, got {}",
           op, like.numel(), codes.str());
  HR_CHECK(absmax.dtype() == DType::f32 && absmax.numel() == q8::block_count(like.numel(), block_size),
           "{}: absmax must be fp32 of {} blocks, got {}", op, q8::block_count(like.numel(), block_size), absmax.str());
  check_same_device(like, codes, op);
  check_same_device(like, absmax, op);
}

// Q8Fault::truncate, after either backend quantised: each code replaced by the
// largest code at or below the value.
void truncate_codes(const Tensor& x, Tensor& codes, const Tensor& absmax, int64_t block_size, const q8::Codebook& c) {
  const std::vector<float> v = x.to_host_f32(), a = absmax.to_host_f32();
  std::vector<uint8_t> q(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    const float s = a[i / static_cast<size_t>(block_size)];
    const float u = s > 0.f ? v[i] / s : 0.f;
    const float* above = std::upper_bound(c.value + 1, c.value + q8::kCodes, u);
    q[i] = static_cast<uint8_t>(above - c.value - 1);
  }
  codes.from_host_bytes(q.data(), q.size());
}

// Q8Fault::lowest_code_as_zero, after either backend quantised: code 0 (the lowest
// value of a signed map) replaced by the code whose value is 0.
void lowest_code_as_zero(Tensor& codes, const q8::Codebook& c) {
  if (!(c.value[0] < 0.f)) return;  // an unsigned map: code 0 is zero already
  const uint8_t zero = static_cast<uint8_t>(std::find(c.value, c.value + q8::kCodes, 0.f) - c.value);
  HR_CHECK(zero < q8::kCodes, "lowest_code_as_zero: the map holds no zero");
  std::vector<uint8_t> q = codes.to_host_bytes();
  for (uint8_t& b : q)
    if (b == 0) b = zero;
  codes.from_host_bytes(q.data(), q.size());
}

void quantize_computed(const Tensor& x, Tensor& codes, Tensor& absmax, int64_t block_size, const q8::Codebook& c) {
  HR_IF_CUDA(x, cuda::quantize_blockwise(x, codes, absmax, block_size, c));
  const float* px = x.data_as<float>();
  uint8_t* pq = codes.data_as<uint8_t>();
  float* pa = absmax.data_as<float>();
  const int64_t n = x.numel();
  for (int64_t b = 0, nb = absmax.numel(); b < nb; ++b) {
    const int64_t begin = b * block_size, end = std::min(n, begin + block_size);
    float a = 0.f;
    for (int64_t i = begin; i < end; ++i) a = fmaxf(a, fabsf(px[i]));
    pa[b] = a;
    for (int64_t i = begin; i < end; ++i) pq[i] = q8::quantize(c, px[i], a);
  }
}

}  // namespace

AdamW8bitOptions applied_options(const AdamW8bitOptions& opt, int64_t numel) {
  AdamW8bitOptions o = opt;
  if (const Q8Fault* f = faults::active<Q8Fault>()) {
    if (f->first_moment_unsigned) o.m_map = q8::MapKind::dynamic_unsigned;
    if (f->one_absmax_per_tensor) o.block_size = std::max<int64_t>(numel, 1);
    if (f->block_factor > 1) o.block_size *= f->block_factor;
  }
  return o;
}

void quantize_blockwise(const Tensor& x, Tensor& codes, Tensor& absmax, int64_t block_size, q8::MapKind map) {
  HR_CHECK(x.defined() && x.dtype() == DType::f32, "quantize_blockwise: fp32 input expected, got {}", x.str());
  check_quantised(x, codes, absmax, block_size, "quantize_blockwise");
  const q8::Codebook& c = codebook(map);
  const OpTimer timer(x, __func__);
  quantize_computed(x, codes, absmax, block_size, c);
  if (const Q8Fault* f = faults::active<Q8Fault>(); f && f->truncate) truncate_codes(x, codes, absmax, block_size, c);
  if (const Q8Fault* f = faults::active<Q8Fault>(); f && f->lowest_code_as_zero) lowest_code_as_zero(codes, c);
}

void dequantize_blockwise(const Tensor& codes, const Tensor& absmax, Tensor& out, int64_t block_size,
                          q8::MapKind map) {
  HR_CHECK(out.defined() && out.dtype() == DType::f32, "dequantize_blockwise: fp32 output expected, got {}",
           out.str());
  check_quantised(out, codes, absmax, block_size, "dequantize_blockwise");
  const q8::Codebook& c = codebook(map);
  HR_IF_CUDA(out, cuda::dequantize_blockwise(codes, absmax, out, block_size, c));
  const uint8_t* pq = codes.data_as<uint8_t>();
  const float* pa = absmax.data_as<float>();
  float* po = out.data_as<float>();
  for (int64_t i = 0, n = out.numel(); i < n; ++i) po[i] = q8::decode(c, pq[i], pa[i / block_size]);
}

namespace {

// adamw8bit_step's checks; its per-step scalars.
optim::AdamWScalars checked_adamw8bit(const Tensor& param, const Tensor& grad, const Tensor& m_codes,
                                      const Tensor& m_absmax, const Tensor& v_codes, const Tensor& v_absmax,
                                      int64_t step, const AdamWConfig& cfg, const AdamW8bitOptions& opt,
                                      const char* op) {
  HR_CHECK(param.defined() && grad.defined(), "{}: undefined tensor", op);
  HR_CHECK(is_float(param.dtype()) && is_float(grad.dtype()), "{}: float tensors expected: {}, {}", op, param.str(),
           grad.str());
  check_same_shape(param, grad, op);
  check_same_device(param, grad, op);
  check_quantised(param, m_codes, m_absmax, opt.block_size, op);
  check_quantised(param, v_codes, v_absmax, opt.block_size, op);
  HR_ARG_CHECK(step >= 1, "{}: step is 1-based, got {}", op, step);
  HR_ARG_CHECK(cfg.beta1 >= 0.f && cfg.beta1 < 1.f && cfg.beta2 >= 0.f && cfg.beta2 < 1.f && cfg.eps > 0.f,
               "{}: betas ({}, {}) must be in [0, 1) and eps {} > 0", op, cfg.beta1, cfg.beta2, cfg.eps);
  return optim::adamw_scalars(cfg.lr, cfg.beta1, cfg.beta2, cfg.eps, cfg.weight_decay, step);
}

}  // namespace

void adamw8bit_step_many(const std::vector<AdamW8bitTensor>& tensors, int64_t step) {
  if (tensors.empty()) return;
  std::vector<optim::AdamWScalars> scalars;  // each tensor's, from its checks
  for (const AdamW8bitTensor& t : tensors) {
    HR_CHECK(t.param && t.grad && t.m_codes && t.m_absmax && t.v_codes && t.v_absmax,
             "adamw8bit_step_many: a null tensor");
    scalars.push_back(checked_adamw8bit(*t.param, *t.grad, *t.m_codes, *t.m_absmax, *t.v_codes, *t.v_absmax, step,
                                        t.cfg, t.opt, "adamw8bit_step_many"));
  }
  optim_many::check_listed_once(tensors, "adamw8bit_step_many");
  const OpTimer timer(*tensors.front().param, __func__);
  std::vector<bool> stepped(tensors.size(), false);
#if HEADROOM_HAVE_CUDA
  // The groups one launch can take, in the order their first tensor comes.
  struct Group {
    const Device* device;
    DType param, grad;
    int64_t block;
    const q8::Codebook *m_map, *v_map;
    std::vector<cuda::AdamW8bitArgs> args;
    std::vector<size_t> index;
  };
  std::vector<Group> groups;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const AdamW8bitTensor& t = tensors[i];
    if (!t.param->is_cuda() || !cuda::adamw8bit_tiled(*t.param, *t.grad, *t.m_codes, *t.v_codes, t.opt.block_size))
      continue;
    const q8::Codebook* cm = &codebook(t.opt.m_map);
    const q8::Codebook* cv = &codebook(t.opt.v_map);
    auto g = std::find_if(groups.begin(), groups.end(), [&](const Group& x) {
      return x.device == &t.param->device() && x.param == t.param->dtype() && x.grad == t.grad->dtype() &&
             x.block == t.opt.block_size && x.m_map == cm && x.v_map == cv;
    });
    if (g == groups.end())
      g = groups.insert(groups.end(),
                        Group{&t.param->device(), t.param->dtype(), t.grad->dtype(), t.opt.block_size, cm, cv, {}, {}});
    g->args.push_back({t.param, t.grad, t.m_codes, t.m_absmax, t.v_codes, t.v_absmax, scalars[i]});
    g->index.push_back(i);
  }
  // Every group's maps on its device before any launch: an upload that fails steps nothing.
  for (const Group& g : groups) cuda::upload_codebooks(*g.m_map, *g.v_map, *g.args.front().param);
  for (const Group& g : groups) {
    cuda::adamw8bit_step_many(g.args, g.block, *g.m_map, *g.v_map);
    for (size_t i : g.index) stepped[i] = true;
  }
#endif
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (stepped[i]) continue;
    const AdamW8bitTensor& t = tensors[i];
    adamw8bit_step(*t.param, *t.grad, *t.m_codes, *t.m_absmax, *t.v_codes, *t.v_absmax, step, t.cfg, t.opt);
  }
}

void adamw8bit_step(Tensor& param, const Tensor& grad, Tensor& m_codes, Tensor& m_absmax, Tensor& v_codes,
                    Tensor& v_absmax, int64_t step, const AdamWConfig& cfg, const AdamW8bitOptions& opt) {
  const char* op = "adamw8bit_step";
  const optim::AdamWScalars s =
      checked_adamw8bit(param, grad, m_codes, m_absmax, v_codes, v_absmax, step, cfg, opt, op);
  const q8::Codebook& cm = codebook(opt.m_map);
  const q8::Codebook& cv = codebook(opt.v_map);
  HR_IF_CUDA(param, cuda::adamw8bit_step(param, grad, m_codes, m_absmax, v_codes, v_absmax, opt.block_size, cm, cv, s));
  dispatch_float2(param.dtype(), grad.dtype(), op, [&](auto tp, auto tg) {
    using TP = decltype(tp);
    using TG = decltype(tg);
    TP* p = param.data_as<TP>();
    const TG* g = grad.data_as<TG>();
    uint8_t* mq = m_codes.data_as<uint8_t>();
    uint8_t* vq = v_codes.data_as<uint8_t>();
    float* ma = m_absmax.data_as<float>();
    float* va = v_absmax.data_as<float>();
    const int64_t n = param.numel();
    std::vector<float> m(static_cast<size_t>(std::min(n, opt.block_size)));
    std::vector<float> v(m.size());
    for (int64_t b = 0, nb = m_absmax.numel(); b < nb; ++b) {
      const int64_t begin = b * opt.block_size, end = std::min(n, begin + opt.block_size);
      float m_new = 0.f, v_new = 0.f;  // the block's new absmax
      for (int64_t i = begin; i < end; ++i) {
        float* mi = &m[static_cast<size_t>(i - begin)];
        float* vi = &v[static_cast<size_t>(i - begin)];
        p[i] = from_float<TP>(q8::adamw8(to_float(p[i]), to_float(g[i]), mq[i], vq[i], ma[b], va[b], cm, cv, s, mi, vi));
        m_new = fmaxf(m_new, fabsf(*mi));
        v_new = fmaxf(v_new, fabsf(*vi));
      }
      ma[b] = m_new;
      va[b] = v_new;
      for (int64_t i = begin; i < end; ++i) {
        mq[i] = q8::quantize(cm, m[static_cast<size_t>(i - begin)], m_new);
        vq[i] = q8::quantize(cv, v[static_cast<size_t>(i - begin)], v_new);
      }
    }
  });
}

}  // namespace hr::ops
