// OPS-1 and DET-1 at run time: the ops a training step is made of, run on the
// device under test in every float dtype, against their float64 references, and
// twice for bitwise repeatability; then a whole training step of each model (loss
// and every gradient) twice, bitwise. The GoogleTest suites cover every op at
// every edge size; this is the subset `headroom run` / `validate` checks on each
// card, so a new GPU is judged on its own arithmetic, not only on self-consistency.
#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "harness/check.hpp"
#include "harness/compare.hpp"
#include "harness/properties/accum_support.hpp"
#include "harness/registry.hpp"
#include "harness/results/results.hpp"
#include "harness/step/train_step.hpp"
#include "harness/tensor.hpp"
#include "harness/tolerances.hpp"
#include "kernels/attention/attention.hpp"
#include "kernels/attention/attention_ref.hpp"
#include "kernels/common/float16.hpp"
#include "kernels/common/op_fault.hpp"
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
  std::string entry;  // the op's entry point, which its fault switch (OpFault::op) names
  nlohmann::json config;
  const tol::PerDType* bound;
  const char* bound_reason;
  std::function<Tensor()> run;  // returns the output tensor
  vecd reference;
};

constexpr const char* kMatmulReason = "tolerances.hpp kMatmulNmse: fp32 accumulation, one output rounding";
constexpr const char* kLinearReason =
    "tolerances.hpp kMatmulNmse: fp32 accumulation; the product and then its sum with the bias each rounded to the "
    "output's dtype (once on the CPU in fp32, where the bias is the product's C)";
constexpr const char* kRowwiseReason = "tolerances.hpp kRowwiseNmse: fp32 arithmetic, one rounding per stored output";
constexpr const char* kElementwiseReason = "tolerances.hpp kElementwiseNmse: one rounding of each stored output";
constexpr const char* kAttentionReason = "tolerances.hpp kAttentionNmse: scores, probabilities and output stored";

std::vector<OpCase> build_cases(Device& dev, DType dt, Preset preset, uint64_t seed) {
  const bool full = preset == Preset::full;
  std::vector<OpCase> cases;

  {  // Matrix product, edge sizes: c [M, N] = a [M, K] b [K, N].
    const int64_t M = full ? 513 : 129, K = full ? 1025 : 257, N = full ? 511 : 127;
    auto a = random_input(dev, {M, K}, dt, seed + 1), b = random_input(dev, {K, N}, dt, seed + 2);
    cases.push_back({"matmul", "matmul", {{"M", M}, {"K", K}, {"N", N}, {"trans_b", false}}, &tol::kMatmulNmse,
                     kMatmulReason,
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
    cases.push_back({"matmul", "matmul", {{"M", M}, {"K", K}, {"N", N}, {"trans_b", true}}, &tol::kMatmulNmse,
                     kMatmulReason,
                     [&dev, a, b, M, N, dt] {
                       Tensor c = Tensor::empty(dev, {M, N}, dt, Consumer::workspace);
                       ops::matmul(a.t, false, b.t, true, c);
                       return c;
                     },
                     ref::matmul(a.stored, false, b.stored, true, vecd(M * N, 0.0), 1, M, N, K)});
  }
  {  // A linear layer with its bias, y [M, N] = x [M, K] w^T + bias: on the CPU in fp32
     // the bias is the product's C (beta = 1), elsewhere the product's output plus
     // the bias; K long enough for a CPU BLAS to split it into panels.
    const int64_t M = full ? 513 : 129, K = 700, N = full ? 255 : 127;
    auto x = random_input(dev, {M, K}, dt, seed + 14), w = random_input(dev, {N, K}, dt, seed + 15),
         bias = random_input(dev, {N}, dt, seed + 16);
    cases.push_back({"linear", "linear_forward", {{"M", M}, {"K", K}, {"N", N}, {"bias", true}}, &tol::kMatmulNmse,
                     kLinearReason,
                     [&dev, x, w, bias, M, N, dt] {
                       Tensor y = Tensor::empty(dev, {M, N}, dt, Consumer::workspace);
                       ops::linear_forward(x.t, w.t, bias.t, y);
                       return y;
                     },
                     ref::linear(x.stored, w.stored, bias.stored, M, K, N)});
  }
  {  // LayerNorm forward over rows of an odd width.
    const int64_t N = full ? 256 : 64, C = 4097;
    auto x = random_input(dev, {N, C}, dt, seed + 5), g = random_input(dev, {C}, dt, seed + 6),
         be = random_input(dev, {C}, dt, seed + 7);
    vecd y, mean, rstd;
    ref::layernorm_forward(x.stored, g.stored, be.stored, N, C, 1e-5, y, mean, rstd);
    cases.push_back({"layernorm_forward", "layernorm_forward", {{"N", N}, {"C", C}}, &tol::kRowwiseNmse, kRowwiseReason,
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
    cases.push_back({"softmax_causal", "softmax_forward", {{"B", B}, {"H", H}, {"T", T}}, &tol::kRowwiseNmse,
                     kRowwiseReason,
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
    cases.push_back({"gelu_forward", "gelu_forward", {{"n", n}}, &tol::kElementwiseNmse, kElementwiseReason,
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
    cases.push_back({"cross_entropy_forward", "cross_entropy_forward", {{"N", N}, {"V", V}}, &tol::kRowwiseNmse,
                     kRowwiseReason,
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
    cases.push_back({fmt::format("attention_{}", ops::attention_impl_name(impl)), "attention_forward",
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

constexpr const char* kDetReason =
    "docs/catalogue.md DET-1: same inputs, same stream, bitwise-identical output (tolerances.hpp kBitwiseMismatches)";

// OPS-1's matrix-product controls, one product per dtype through the same NMSE
// check, both switches of the op (OpFault). Gross: b read transposed. Subtle: `a`
// read rounded to p significand bits, as a TF32 product reads fp32. For a uniform
// on [-1, 1) the rounding error of an element in [2^e, 2^(e+1)) is uniform with
// variance 2^(2(e-p)) / 12, which over the binades gives E[da^2] / E[a^2] =
// 2^-2p / 28, and the product's NMSE is that ratio (K independent terms). p is the
// width whose predicted NMSE is nearest 30x the bound (fp32: 10 bits as fp16 keeps,
// 34x; fp16: 5 bits, 35x; bf16: 2 bits as fp8 e5m2 keeps, 45x), an error the check
// must see although it is near its bound.
std::vector<Measurement> ops1_controls(Device& dev, DType dt, uint64_t seed) {
  std::vector<Measurement> out;
  auto tagged = [&](Measurement m, nlohmann::json config) {
    m.metric = "nmse";
    m.tolerance_reason = kMatmulReason;
    m.backend = backend_name(dev.kind());
    m.dtype = dtype_name(dt);
    m.model = "op:matmul";
    m.config = std::move(config);
    return m;
  };
  const double bound = tol::kMatmulNmse(dt);
  {  // Gross: the wrong transpose (a square b used as b^T).
    const int64_t n = 64;
    auto a = random_input(dev, {n, n}, dt, seed + 20), b = random_input(dev, {n, n}, dt, seed + 21);
    Tensor c = Tensor::empty(dev, {n, n}, dt, Consumer::workspace);
    {
      ops::ScopedOpFault fault({"matmul", 0, 0, 0, true});
      ops::matmul(a.t, false, b.t, false, c);
    }
    const double e =
        nmse(c.to_host_f32(), ref::matmul(a.stored, false, b.stored, false, vecd(n * n, 0.0), 1, n, n, n));
    out.push_back(tagged(make_negative_control("OPS-1", "matmul with the wrong transpose is caught", e, bound, check_name("OPS-1", "matmul forward against float64")),
                         {{"M", n}, {"K", n}, {"N", n}, {"broken", "b transposed"}}));
  }
  {  // Subtle: one input rounded to a coarser significand.
    const int64_t M = 128, K = 257, N = 127;
    auto a = random_input(dev, {M, K}, dt, seed + 22), b = random_input(dev, {K, N}, dt, seed + 23);
    const int bits = static_cast<int>(std::lround(-0.5 * std::log2(28.0 * 30.0 * bound)));
    Tensor c = Tensor::empty(dev, {M, N}, dt, Consumer::workspace);
    {
      ops::ScopedOpFault fault({"matmul", 0, 0, bits, false});
      ops::matmul(a.t, false, b.t, false, c);
    }
    const double e =
        nmse(c.to_host_f32(), ref::matmul(a.stored, false, b.stored, false, vecd(M * N, 0.0), 1, M, N, K));
    Measurement m = tagged(
        make_subtle_control("OPS-1", fmt::format("matmul with a rounded to {} significand bits is caught", bits), e,
                            bound, check_name("OPS-1", "matmul forward against float64")),
        {{"M", M}, {"K", K}, {"N", N}, {"broken", fmt::format("a rounded to {} significand bits", bits)}});
    m.details = {{"predicted_nmse", std::ldexp(1.0, -2 * bits) / 28.0}};
    out.push_back(std::move(m));
  }
  return out;
}

// ---- DET-1 over a whole training step ----
// The step's loss and every gradient element, in order: the loss as a double,
// gradients as fp32.
struct StepValues {
  double loss = 0;
  props::NamedValues grads;
};

// A small step of each model with two micro-batches (accumulation), dropout on
// (the masks' stream is part of what must repeat) and, for the MLP, BatchNorm
// (per-micro-batch statistics and running statistics on the way).
StepConfig det_step_config(ModelKind model, DType dt, Preset preset) {
  StepConfig c = model == ModelKind::mlp
                     ? props::accum_mlp_config(dt, props::kEffectiveBatch / 2, preset, NormKind::batchnorm)
                     : props::accum_transformer_config(dt, props::kEffectiveBatch / 2, preset);
  c.mlp.dropout = 0.1f;
  c.transformer.dropout = 0.1f;
  return c;
}

StepValues run_step(Device& dev, const StepConfig& cfg, const Batch& batch) {
  TrainStep step(dev, cfg);
  StepValues v;
  v.loss = step.forward_backward(batch);
  v.grads = props::gradient_values(step);
  return v;
}

// Elements whose bits differ (the loss counts as one element); `compared` is set
// to the number of elements.
size_t element_mismatches(const StepValues& a, const StepValues& b, size_t* compared) {
  size_t bad = std::memcmp(&a.loss, &b.loss, sizeof a.loss) != 0, n = 1;
  HR_CHECK(a.grads.size() == b.grads.size(), "DET-1: {} gradient tensors against {}", a.grads.size(), b.grads.size());
  for (size_t t = 0; t < a.grads.size(); ++t) {
    const auto &x = a.grads[t].second, &y = b.grads[t].second;
    HR_CHECK(x.size() == y.size(), "DET-1: gradient '{}' has {} elements against {}", a.grads[t].first, x.size(),
             y.size());
    for (size_t i = 0; i < x.size(); ++i) bad += std::memcmp(&x[i], &y[i], sizeof(float)) != 0;
    n += x.size();
  }
  if (compared) *compared = n;
  return bad;
}

// DET-1 on a step of each model: the check, a gross control (a step whose dropout
// key changes from run to run) and a subtle one (a step that leaves one gradient
// element one ulp away every other run, as one reduction summed in another order
// would: the smallest difference there is, one mismatching element). Both controls
// are switches of the step (StepConfig::fault_*), run twice as the check is.
std::vector<Measurement> det1_step(Device& dev, DType dt, Preset preset, uint64_t seed) {
  std::vector<Measurement> out;
  for (ModelKind model : {ModelKind::mlp, ModelKind::transformer}) {
    const StepConfig cfg = det_step_config(model, dt, preset);
    const Batch batch = props::accum_batch(dev, cfg, seed + 30);
    auto tagged = [&](Measurement m) {
      m.backend = backend_name(dev.kind());
      m.dtype = dtype_name(dt);
      m.model = model_kind_name(model);
      m.metric = "mismatching_elements";
      m.tolerance_reason = kDetReason;
      m.config["micro_batch"] = cfg.micro_batch;
      m.config["batch"] = cfg.batch;
      m.config["dropout"] = 0.1;
      return m;
    };
    const StepValues first = run_step(dev, cfg, batch);
    const StepValues second = run_step(dev, cfg, batch);
    size_t compared = 0;
    const size_t bad = element_mismatches(first, second, &compared);
    Measurement d = tagged(make_check("DET-1", "a training step twice gives the same loss and gradients",
                                      static_cast<double>(bad), tol::kBitwiseMismatches));
    d.details = {{"elements", compared}};
    out.push_back(std::move(d));

    // The controls are the step's repeatability switches, on both runs: a dropout key
    // that changes with every step built (gross), one gradient element one ulp up in
    // every other step built (subtle: one reduction summed in another order).
    const std::string det_check = check_name("DET-1", "a training step twice gives the same loss and gradients");
    StepConfig reseeded = cfg;
    reseeded.fault_dropout_key_per_run = true;
    const size_t gross =
        element_mismatches(run_step(dev, reseeded, batch), run_step(dev, reseeded, batch), nullptr);
    Measurement g = tagged(make_negative_control("DET-1", "a step with other dropout masks is caught",
                                                 static_cast<double>(gross), tol::kBitwiseMismatches, det_check));
    g.config["broken"] = "fault_dropout_key_per_run";
    g.details = {{"elements", compared}};
    out.push_back(std::move(g));

    StepConfig ulp = cfg;
    ulp.fault_nondeterministic_ulp = true;
    const size_t subtle = element_mismatches(run_step(dev, ulp, batch), run_step(dev, ulp, batch), nullptr);
    Measurement s = tagged(make_subtle_control("DET-1", "a step one ulp off in one gradient element is caught",
                                               static_cast<double>(subtle), tol::kBitwiseMismatches, det_check));
    s.config["broken"] = "fault_nondeterministic_ulp";
    s.details = {{"elements", compared}};
    out.push_back(std::move(s));
  }
  return out;
}

// Every op's controls, both switches of the op (OpFault), through its own checks.
// OPS-1: the stored output off by a relative eps with alternating signs, whose NMSE
// is eps^2 on top of the op's own error: gross eps = 1/4, subtle eps = 2^-q with q
// the whole power of two nearest sqrt(30 x bound), so 15 to 60 bounds. DET-1: on
// every other call one output element one ulp up (subtle: the one-element
// difference a reduction in another order makes) or every element (gross).
std::vector<Measurement> op_controls(const Device& dev, DType dt, const OpCase& c) {
  std::vector<Measurement> out;
  const double bound = (*c.bound)(dt);
  const std::string ops_check = check_name("OPS-1", fmt::format("{} forward against float64", c.name));
  const int q = static_cast<int>(std::lround(-0.5 * std::log2(30.0 * bound)));
  for (const bool subtle : {false, true}) {
    const double eps = subtle ? std::ldexp(1.0, -q) : 0.25;
    double e = 0;
    {
      ops::OpFault f;
      f.op = c.entry;
      f.output_rel_error = eps;
      ops::ScopedOpFault fault(f);
      e = nmse(c.run().to_host_f32(), c.reference);
    }
    const std::string title = fmt::format("{} with its output off by {} is caught", c.name,
                                          subtle ? fmt::format("2^-{}", q) : std::string("a quarter"));
    Measurement m = subtle ? make_subtle_control("OPS-1", title, e, bound, ops_check)
                           : make_negative_control("OPS-1", title, e, bound, ops_check);
    m.metric = "nmse";
    m.tolerance_reason = c.bound_reason;
    m.details = {{"predicted_nmse", eps * eps}};
    m = tag(std::move(m), dev, dt, c);
    m.config["broken"] = fmt::format("OpFault output_rel_error {}", eps);
    out.push_back(std::move(m));
  }
  const std::string det_check = check_name("DET-1", fmt::format("{} twice gives the same bytes", c.name));
  for (const bool subtle : {false, true}) {
    size_t bad = 0, bytes = 0;
    {
      ops::OpFault f;
      f.op = c.entry;
      f.unstable_elements = subtle ? 1 : std::numeric_limits<int64_t>::max();
      ops::ScopedOpFault fault(f);
      const Tensor first = c.run(), second = c.run();
      bad = bitwise_mismatches(first.to_host_bytes(), second.to_host_bytes());
      bytes = first.nbytes();
    }
    const std::string title = fmt::format("{} with {} one ulp off every other call is caught", c.name,
                                          subtle ? "one output element" : "every output element");
    Measurement m = subtle ? make_subtle_control("DET-1", title, static_cast<double>(bad), tol::kBitwiseMismatches,
                                                 det_check)
                           : make_negative_control("DET-1", title, static_cast<double>(bad),
                                                   tol::kBitwiseMismatches, det_check);
    m.metric = "bitwise_mismatches";
    m.tolerance_reason = kDetReason;
    m.details = {{"bytes", bytes}};
    m = tag(std::move(m), dev, dt, c);
    m.config["broken"] = fmt::format("OpFault unstable_elements {}", subtle ? "1" : "all");
    out.push_back(std::move(m));
  }
  return out;
}

std::vector<Measurement> run_ops_conformance(RunContext& ctx) {
  Device& dev = ctx.device;
  std::vector<Measurement> out;
  for (DType dt : kFloatDTypes) {
    if (ctx.progress) ctx.progress(fmt::format("ops in {}", dtype_name(dt)));
    std::set<std::string> controlled;
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
                                 static_cast<double>(bad), tol::kBitwiseMismatches);
      d.metric = "bitwise_mismatches";
      d.tolerance_reason = kDetReason;
      d.details = {{"bytes", first.nbytes()}};
      out.push_back(tag(std::move(d), dev, dt, c));
      // One set of controls per check (the two products share theirs).
      if (controlled.insert(c.name).second)
        for (auto& m : op_controls(dev, dt, c)) out.push_back(std::move(m));
    }
    for (auto& m : ops1_controls(dev, dt, ctx.seed)) out.push_back(std::move(m));
    if (ctx.progress) ctx.progress(fmt::format("a training step twice in {}", dtype_name(dt)));
    // A failure here is a measurement, not the end of the property's other results.
    try {
      for (auto& m : det1_step(dev, dt, ctx.preset, ctx.seed)) out.push_back(std::move(m));
    } catch (const std::exception& ex) {
      Measurement m = make_error_measurement("DET-1", "a training step twice gives the same loss and gradients",
                                             backend_name(dev.kind()), ex.what());
      m.dtype = dtype_name(dt);
      out.push_back(std::move(m));
    }
  }
  return out;
}

}  // namespace

HR_REGISTER_PROPERTY(PropertySpec{
    "OPS-1", "op forwards against float64 on this device; ops and a training step twice bitwise (DET-1)", 2.0,
    run_ops_conformance, ""});

}  // namespace hr
