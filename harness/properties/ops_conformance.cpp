// OPS-1 and DET-1 at run time: the ops a training step is made of, run on the
// device under test in every float dtype, against their float64 references, and
// twice for bitwise repeatability. The GoogleTest suites cover every op at every
// edge size; this is the subset `headroom run` / `validate` checks on each card,
// so a new GPU is judged on its own arithmetic, not only on self-consistency.
#include <fmt/format.h>

#include <functional>
#include <random>
#include <string>
#include <vector>

#include "harness/compare.hpp"
#include "harness/registry.hpp"
#include "harness/tensor.hpp"
#include "harness/tolerances.hpp"
#include "kernels/attention/attention.hpp"
#include "kernels/attention/attention_ref.hpp"
#include "kernels/common/float16.hpp"
#include "kernels/crossentropy/crossentropy.hpp"
#include "kernels/crossentropy/crossentropy_ref.hpp"
#include "kernels/gelu/gelu.hpp"
#include "kernels/gelu/gelu_ref.hpp"
#include "kernels/layernorm/layernorm.hpp"
#include "kernels/layernorm/layernorm_ref.hpp"
#include "kernels/matmul/matmul.hpp"
#include "kernels/matmul/matmul_ref.hpp"
#include "kernels/softmax/softmax.hpp"
#include "kernels/softmax/softmax_ref.hpp"

namespace hr {
namespace {

using vecd = std::vector<double>;

// A tensor of random non-zero values in [-1, 1) stored in `dt`, and the values as
// stored (what the op reads, and so what the reference is given).
struct Input {
  Tensor t;
  vecd stored;
};

Input random_input(Device& dev, Shape shape, DType dt, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<float> v(static_cast<size_t>(shape_numel(shape)));
  for (auto& x : v) {
    do x = u(rng);
    while (x == 0.f);
  }
  Input in{Tensor::from_host(dev, v, std::move(shape), dt, Consumer::workspace), {}};
  const auto back = in.t.to_host_f32();
  in.stored.assign(back.begin(), back.end());
  return in;
}

// One op case: runs the op into freshly allocated outputs and returns the output
// that is compared (as host floats and as bytes for DET-1).
struct OpCase {
  std::string name;
  nlohmann::json config;
  const tol::PerDType* bound;
  const char* bound_reason;
  std::function<Tensor()> run;  // returns the output tensor
  vecd reference;
};

constexpr const char* kMatmulReason = "tolerances.hpp kMatmulNmse: fp32 accumulation, one output rounding";
constexpr const char* kRowwiseReason = "tolerances.hpp kRowwiseNmse: fp32 arithmetic, one rounding per stored output";
constexpr const char* kElementwiseReason = "tolerances.hpp kElementwiseNmse: one rounding of each stored output";
constexpr const char* kAttentionReason = "tolerances.hpp kAttentionNmse: scores, probabilities and output stored";

std::vector<OpCase> build_cases(Device& dev, DType dt, Preset preset, uint64_t seed) {
  const bool full = preset == Preset::full;
  std::vector<OpCase> cases;

  {  // Matrix product, edge sizes: c [M, N] = a [M, K] b [K, N].
    const int64_t M = full ? 513 : 129, K = full ? 1025 : 257, N = full ? 511 : 127;
    auto a = random_input(dev, {M, K}, dt, seed + 1), b = random_input(dev, {K, N}, dt, seed + 2);
    cases.push_back({"matmul", {{"M", M}, {"K", K}, {"N", N}, {"trans_b", false}}, &tol::kMatmulNmse, kMatmulReason,
                     [&dev, a, b, M, N, dt] {
                       Tensor c = Tensor::empty(dev, {M, N}, dt, Consumer::workspace);
                       ops::matmul(a.t, false, b.t, false, c);
                       return c;
                     },
                     ref::matmul(a.stored, false, b.stored, false, vecd(M * N, 0.0), 1, M, N, K)});
  }
  {  // Linear layout (b transposed), a long inner dimension.
    const int64_t M = 128, K = 4097, N = 17;
    auto a = random_input(dev, {M, K}, dt, seed + 3), b = random_input(dev, {N, K}, dt, seed + 4);
    cases.push_back({"matmul", {{"M", M}, {"K", K}, {"N", N}, {"trans_b", true}}, &tol::kMatmulNmse, kMatmulReason,
                     [&dev, a, b, M, N, dt] {
                       Tensor c = Tensor::empty(dev, {M, N}, dt, Consumer::workspace);
                       ops::matmul(a.t, false, b.t, true, c);
                       return c;
                     },
                     ref::matmul(a.stored, false, b.stored, true, vecd(M * N, 0.0), 1, M, N, K)});
  }
  {  // LayerNorm forward over rows of an odd width.
    const int64_t N = full ? 256 : 64, C = 4097;
    auto x = random_input(dev, {N, C}, dt, seed + 5), g = random_input(dev, {C}, dt, seed + 6),
         be = random_input(dev, {C}, dt, seed + 7);
    vecd y, mean, rstd;
    ref::layernorm_forward(x.stored, g.stored, be.stored, N, C, 1e-5, y, mean, rstd);
    cases.push_back({"layernorm_forward", {{"N", N}, {"C", C}}, &tol::kRowwiseNmse, kRowwiseReason,
                     [&dev, x, g, be, N, C, dt] {
                       Tensor out = Tensor::empty(dev, {N, C}, dt, Consumer::workspace);
                       Tensor m = Tensor::empty(dev, {N}, DType::f32, Consumer::workspace);
                       Tensor r = Tensor::empty(dev, {N}, DType::f32, Consumer::workspace);
                       ops::layernorm_forward(x.t, g.t, be.t, 1e-5f, out, m, r);
                       return out;
                     },
                     y});
  }
  {  // Causal softmax over scores [B, H, T, T].
    const int64_t B = 2, H = 3, T = 129;
    auto s = random_input(dev, {B, H, T, T}, dt, seed + 8);
    const float scale = 0.125f;
    vecd p;
    ref::softmax_forward(s.stored, ref::SoftmaxShape{B, H, T, T}, true, {}, {}, scale, p);
    cases.push_back({"softmax_causal", {{"B", B}, {"H", H}, {"T", T}}, &tol::kRowwiseNmse, kRowwiseReason,
                     [&dev, s, B, H, T, dt, scale] {
                       Tensor out = Tensor::empty(dev, {B, H, T, T}, dt, Consumer::workspace);
                       ops::softmax_forward(s.t, ops::AttnMask{}, scale, out);
                       return out;
                     },
                     p});
  }
  {  // GELU, an edge size.
    const int64_t n = full ? (1 << 20) + 1 : 4097;
    auto x = random_input(dev, {n}, dt, seed + 9);
    cases.push_back({"gelu_forward", {{"n", n}}, &tol::kElementwiseNmse, kElementwiseReason,
                     [&dev, x, n, dt] {
                       Tensor y = Tensor::empty(dev, {n}, dt, Consumer::workspace);
                       ops::gelu_forward(x.t, y);
                       return y;
                     },
                     ref::gelu_forward(x.stored)});
  }
  {  // Cross-entropy per-token losses, every 7th target ignored.
    const int64_t N = 64, V = full ? 50304 : 1000;
    auto logits = random_input(dev, {N, V}, dt, seed + 10);
    std::vector<int32_t> targets(N);
    std::mt19937 rng(static_cast<uint32_t>(seed));
    for (int64_t i = 0; i < N; ++i) targets[i] = i % 7 == 3 ? -100 : static_cast<int32_t>(rng() % V);
    Tensor tg = Tensor::from_host_i32(dev, targets, {N}, Consumer::workspace);
    ops::CrossEntropyConfig cfg;
    vecd losses;
    ref::cross_entropy_forward(logits.stored, targets, V, cfg, losses);
    cases.push_back({"cross_entropy_forward", {{"N", N}, {"V", V}}, &tol::kRowwiseNmse, kRowwiseReason,
                     [&dev, logits, tg, cfg, N] {
                       Tensor l = Tensor::empty(dev, {N}, DType::f32, Consumer::workspace);
                       ops::cross_entropy_forward(logits.t, tg, cfg, l);
                       return l;
                     },
                     losses});
  }
  for (auto impl : {ops::AttentionImpl::naive, ops::AttentionImpl::memory_efficient}) {
    const int64_t B = 1, H = 2, T = full ? 1024 : 129, D = 64;
    auto q = random_input(dev, {B, H, T, D}, dt, seed + 11), k = random_input(dev, {B, H, T, D}, dt, seed + 12),
         v = random_input(dev, {B, H, T, D}, dt, seed + 13);
    const float scale = 0.125f;
    cases.push_back({fmt::format("attention_{}", ops::attention_impl_name(impl)),
                     {{"B", B}, {"H", H}, {"T", T}, {"D", D}, {"mask", "causal"}}, &tol::kAttentionNmse,
                     kAttentionReason,
                     [&dev, q, k, v, B, H, T, D, dt, impl, scale] {
                       Tensor o = Tensor::empty(dev, {B, H, T, D}, dt, Consumer::workspace);
                       ops::AttentionSaved saved;
                       ops::attention_forward(impl, q.t, k.t, v.t, ops::AttnMask{}, scale, o, saved,
                                              Consumer::workspace);
                       return o;
                     },
                     ref::attention_forward(q.stored, k.stored, v.stored, ref::AttentionShape{B, H, T, D}, true, {},
                                            {}, scale)});
  }
  return cases;
}

Measurement tag(Measurement m, const Device& dev, DType dt, const OpCase& c) {
  m.backend = backend_name(dev.kind());
  m.dtype = dtype_name(dt);
  m.model = "op:" + c.name;
  m.config = c.config;
  return m;
}

std::vector<Measurement> run_ops_conformance(RunContext& ctx) {
  Device& dev = ctx.device;
  std::vector<Measurement> out;
  for (DType dt : kFloatDTypes) {
    if (ctx.progress) ctx.progress(fmt::format("ops in {}", dtype_name(dt)));
    for (const OpCase& c : build_cases(dev, dt, ctx.preset, ctx.seed)) {
      const Tensor first = c.run();
      const std::vector<float> got = first.to_host_f32();
      const double e = nmse(got, c.reference);
      Measurement m = make_check("OPS-1", fmt::format("{} forward against float64", c.name), e, (*c.bound)(dt));
      m.metric = "nmse";
      m.tolerance_reason = c.bound_reason;
      m.details = {{"elements", got.size()}};
      out.push_back(tag(std::move(m), dev, dt, c));

      const Tensor second = c.run();
      const size_t bad = bitwise_mismatches(first.to_host_bytes(), second.to_host_bytes());
      Measurement d = make_check("DET-1", fmt::format("{} twice gives the same bytes", c.name),
                                 static_cast<double>(bad), 0.0);
      d.metric = "bitwise_mismatches";
      d.tolerance_reason = "PROPERTIES.md DET-1: same inputs, same stream, bitwise-identical output";
      d.details = {{"bytes", first.nbytes()}};
      out.push_back(tag(std::move(d), dev, dt, c));
    }
    // Negative control: the same check on a product computed with the wrong
    // transpose (a square b used as b^T) must fail, or the check proves nothing.
    const int64_t n = 64;
    auto a = random_input(dev, {n, n}, dt, ctx.seed + 20), b = random_input(dev, {n, n}, dt, ctx.seed + 21);
    Tensor c = Tensor::empty(dev, {n, n}, dt, Consumer::workspace);
    ops::matmul(a.t, false, b.t, true, c);
    const double e = nmse(c.to_host_f32(), ref::matmul(a.stored, false, b.stored, false, vecd(n * n, 0.0), 1, n, n, n));
    Measurement m = make_negative_control("OPS-1", "matmul with the wrong transpose is caught", e,
                                          tol::kMatmulNmse(dt));
    m.metric = "nmse";
    m.tolerance_reason = kMatmulReason;
    m.backend = backend_name(dev.kind());
    m.dtype = dtype_name(dt);
    m.model = "op:matmul";
    m.config = {{"M", n}, {"K", n}, {"N", n}, {"broken", "b transposed"}};
    out.push_back(std::move(m));
  }
  return out;
}

}  // namespace

HR_REGISTER_PROPERTY(PropertySpec{"OPS-1", "op forwards against float64 on this device, and twice bitwise (DET-1)",
                                  2.0, run_ops_conformance});

}  // namespace hr
