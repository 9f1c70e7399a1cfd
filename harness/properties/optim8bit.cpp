// Q8: 8-bit optimizer state (Dettmers et al. 2022; bitsandbytes' Adam8bit as the
// anchor). Round trip of the block-wise dynamic quantisation (Q8-1), one-step
// tracking of fp32 AdamW with resynced states (Q8-2), a long run without resync
// (Q8-3), the state's bytes as the tracker sees them (Q8-4), and an exact save and
// reload of the quantised state (Q8-5), each with a gross and a subtle control.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "harness/check.hpp"
#include "harness/data/synthetic.hpp"
#include "harness/models/params.hpp"
#include "harness/registry.hpp"
#include "harness/step/optimizer.hpp"
#include "harness/step/train_step.hpp"
#include "harness/tolerances.hpp"
#include "kernels/optim/optim8.hpp"

namespace hr::props {
namespace {

using q8::MapKind;

// Q8-2's outlier block: its gradients this many times the others' typical size.
constexpr float kQ8OutlierGross = 1e5f;
// Q8-3's run in the quick preset (500 in full).
constexpr int kQ8LongStepsQuick = 200;  // the loss levels off within ~100 steps
constexpr float kQ8TargetNoise = 0.5f;
constexpr float kQ8LongLr = 3e-3f;

void describe(Measurement& m, Device& dev, const std::string& model, nlohmann::json config, const char* metric,
              const char* reason) {
  m.backend = backend_name(dev.kind());
  m.dtype = "fp32";
  m.model = model;
  m.config = std::move(config);
  m.metric = metric;
  m.tolerance_reason = reason;
}

std::vector<float> randn(std::mt19937_64& rng, size_t n, float scale) {
  std::normal_distribution<float> d(0.f, 1.f);
  std::vector<float> v(n);
  for (float& x : v) x = scale * d(rng);
  return v;
}

// ---- Q8-1: round trip -----------------------------------------------------------

// Half the gap between the two codes around normalised value u (beyond the lowest
// code, the gap of the two lowest), from the sorted codebook.
double half_gap(const q8::Codebook& c, double u) {
  // j: the last code <= u (0 below the lowest), at most kCodes - 2.
  const float* above = std::upper_bound(c.value + 1, c.value + q8::kCodes - 1, u,
                                        [](double x, float v) { return x < static_cast<double>(v); });
  const int j = static_cast<int>(above - c.value) - 1;
  return 0.5 * (static_cast<double>(c.value[j + 1]) - static_cast<double>(c.value[j]));
}

// Worst |x - x_hat| / (half_gap(x / absmax) * absmax) over the elements, against the dynamic map.
double round_trip_ratio(const std::vector<float>& x, const std::vector<float>& x_hat, const std::vector<float>& absmax,
                        int64_t block, MapKind map) {
  const q8::Codebook c = q8::make_codebook(map);
  double worst = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double a = absmax[i / static_cast<size_t>(block)];
    if (a == 0) {
      worst = std::max(worst, x_hat[i] == 0.f ? 0.0 : INFINITY);
      continue;
    }
    const double bound = half_gap(c, static_cast<double>(x[i]) / a) * a;
    worst = std::max(worst, std::fabs(static_cast<double>(x_hat[i]) - x[i]) / bound);
  }
  return worst;
}

std::vector<Measurement> q8_round_trip(RunContext& ctx) {
  Device& dev = ctx.device;
  std::vector<Measurement> out;
  const int64_t rows = ctx.preset == Preset::quick ? 64 : 1024, cols = 4097;  // a partial last block
  const size_t n = static_cast<size_t>(rows * cols);
  std::mt19937_64 rng(ctx.seed * 7919 + 1);
  // Magnitudes spread over six decades, so every part of the map is used.
  std::uniform_real_distribution<float> decade(-6.f, 0.f);
  std::vector<float> x = randn(rng, n, 1.f);
  for (float& v : x) v *= std::pow(10.f, decade(rng));
  for (const MapKind map : {MapKind::dynamic_signed, MapKind::dynamic_unsigned}) {
    const bool is_signed = map == MapKind::dynamic_signed;
    std::vector<float> data = x;
    if (!is_signed)
      for (float& v : data) v = v * v;  // second-moment-like: non-negative, squared range
    const Tensor t = Tensor::from_host(dev, data, {rows, cols}, DType::f32, Consumer::workspace);
    for (const int64_t block : {q8::kDefaultBlock, q8::kLargeBlock}) {
      const Shape blocks{q8::block_count(static_cast<int64_t>(n), block)};
      Tensor codes = Tensor::empty(dev, {rows, cols}, DType::u8, Consumer::workspace);
      Tensor absmax = Tensor::empty(dev, blocks, DType::f32, Consumer::workspace);
      Tensor back = Tensor::empty(dev, {rows, cols}, DType::f32, Consumer::workspace);
      const nlohmann::json cfg = {{"map", is_signed ? "dynamic_signed" : "dynamic_unsigned"},
                                  {"block_size", block}, {"shape", {rows, cols}}};
      auto emit = [&](Measurement m) {
        describe(m, dev, "op:quantize_blockwise", cfg, "max_error_over_half_gap", tol::kQ8RoundTripReason);
        out.push_back(std::move(m));
      };
      ops::quantize_blockwise(t, codes, absmax, block, map);
      ops::dequantize_blockwise(codes, absmax, back, block, map);
      const double ratio = round_trip_ratio(data, back.to_host_f32(), absmax.to_host_f32(), block, map);
      emit(make_check("Q8-1", "block-wise dynamic quantisation: round trip within half the map's gap", ratio,
                      tol::kQ8RoundTripRatio));
      if (block != q8::kDefaultBlock) continue;
      // The controls are switches of the quantiser (ops::Q8Fault), judged against the
      // dynamic map's gaps as the check is. Gross: the linear map (uniform codes on
      // [-1, 1] or [0, 1]) loses the small values. Subtle: the code at or below the
      // value instead of the nearest (truncation).
      const std::string q8_1 =
          check_name("Q8-1", "block-wise dynamic quantisation: round trip within half the map's gap");
      for (const bool subtle : {false, true}) {
        ops::Q8Fault f;
        (subtle ? f.truncate : f.linear_maps) = true;
        double r = 0;
        {
          ops::ScopedQ8Fault fault(f);
          ops::quantize_blockwise(t, codes, absmax, block, map);
          ops::dequantize_blockwise(codes, absmax, back, block, map);
          r = round_trip_ratio(data, back.to_host_f32(), absmax.to_host_f32(), block, map);
        }
        emit(subtle ? make_subtle_control("Q8-1",
                                          "negative control (subtle): the code below the value, not the nearest", r,
                                          tol::kQ8RoundTripRatio, q8_1)
                    : make_negative_control("Q8-1", "negative control (gross): a linear map instead of the dynamic one",
                                            r, tol::kQ8RoundTripRatio, q8_1));
      }
    }
  }
  return out;
}

// ---- Q8-2: one-step tracking, states resynced --------------------------------------

struct TrackResult {
  double param_mean_abs = 0;       // worst step
  int64_t state_not_close = 0;     // worst step, both moments
  nlohmann::json per_step = nlohmann::json::array();
};

// fp32 AdamW and 8-bit AdamW from the same state each step: the 8-bit state is the
// quantised fp32 state (resync), the parameters are copied, the gradient is shared.
// `outlier` scales the gradient of the first 256 elements (one block).
TrackResult track(Device& dev, int64_t rows, int64_t cols, int64_t block_size, float outlier, int warmup, int steps,
                  uint64_t seed) {
  const int64_t n = rows * cols;
  std::mt19937_64 rng(seed);
  const ops::AdamWConfig cfg{1e-3f, 0.9f, 0.999f, 1e-8f, 0.f};  // torch.optim.Adam's defaults
  ops::AdamW8bitOptions asked;
  asked.block_size = block_size;
  // The resync stores the state as the optimizer would (its faults included).
  const ops::AdamW8bitOptions opt = ops::applied_options(asked, n);
  const int64_t block = opt.block_size;
  const Shape shape{rows, cols}, blocks{q8::block_count(n, block)};
  Tensor p32 = Tensor::from_host(dev, randn(rng, static_cast<size_t>(n), 0.1f), shape, DType::f32, Consumer::weights);
  Tensor p8 = p32.clone();
  Tensor m32 = Tensor::zeros(dev, shape, DType::f32, Consumer::optimizer_state);
  Tensor v32 = Tensor::zeros(dev, shape, DType::f32, Consumer::optimizer_state);
  Tensor mq = Tensor::zeros(dev, shape, DType::u8, Consumer::optimizer_state);
  Tensor vq = Tensor::zeros(dev, shape, DType::u8, Consumer::optimizer_state);
  Tensor ma = Tensor::zeros(dev, blocks, DType::f32, Consumer::optimizer_state);
  Tensor va = Tensor::zeros(dev, blocks, DType::f32, Consumer::optimizer_state);
  Tensor m8 = Tensor::empty(dev, shape, DType::f32, Consumer::workspace);
  Tensor v8 = Tensor::empty(dev, shape, DType::f32, Consumer::workspace);
  auto gradient = [&] {
    std::vector<float> g = randn(rng, static_cast<size_t>(n), 0.01f);
    // The outlier block's gradients have one magnitude (random signs), so its absmax,
    // and where the other blocks' moments fall in a per-tensor map, do not vary by seed.
    if (outlier != 1.f)
      for (int64_t i = 0; i < std::min<int64_t>(n, q8::kDefaultBlock); ++i)
        g[static_cast<size_t>(i)] = g[static_cast<size_t>(i)] >= 0.f ? 0.01f * outlier : -0.01f * outlier;
    return Tensor::from_host(dev, g, shape, DType::f32, Consumer::gradients);
  };
  TrackResult r;
  int64_t t = 0;
  for (int w = 0; w < warmup; ++w) ops::adamw_step(p32, gradient(), m32, v32, ++t, cfg);  // a state to track
  for (int s = 0; s < steps; ++s) {
    ops::quantize_blockwise(m32, mq, ma, block, opt.m_map);
    ops::quantize_blockwise(v32, vq, va, block, opt.v_map);
    p8.copy_from(p32);
    const Tensor g = gradient();
    ++t;
    ops::adamw_step(p32, g, m32, v32, t, cfg);
    ops::adamw8bit_step(p8, g, mq, ma, vq, va, t, cfg, opt);
    const std::vector<float> a = p32.to_host_f32(), b = p8.to_host_f32();
    double sum = 0;
    for (size_t i = 0; i < a.size(); ++i) sum += std::fabs(static_cast<double>(a[i]) - b[i]);
    const double mean_abs = sum / static_cast<double>(a.size());
    ops::dequantize_blockwise(mq, ma, m8, block, opt.m_map);
    ops::dequantize_blockwise(vq, va, v8, block, opt.v_map);
    int64_t not_close = 0;
    for (const auto& [ref, got] : {std::pair{&m32, &m8}, std::pair{&v32, &v8}}) {
      const std::vector<float> x = ref->to_host_f32(), y = got->to_host_f32();
      for (size_t i = 0; i < x.size(); ++i)
        if (!(std::fabs(x[i] - y[i]) <= tol::kQ8TrackStateAtol + tol::kQ8TrackStateRtol * std::fabs(x[i])))
          ++not_close;
    }
    r.param_mean_abs = std::max(r.param_mean_abs, mean_abs);
    r.state_not_close = std::max(r.state_not_close, not_close);
    r.per_step.push_back({{"step", t}, {"param_mean_abs", mean_abs}, {"state_not_close", not_close}});
  }
  return r;
}

std::vector<Measurement> q8_tracking(RunContext& ctx) {
  Device& dev = ctx.device;
  std::vector<Measurement> out;
  const bool full = ctx.preset == Preset::full;
  const int64_t rows = full ? 1024 : 64;
  const int warmup = 3, steps = full ? 10 : 3;
  auto emit = [&](Measurement m, int64_t cols, int64_t block, float outlier, const TrackResult& r) {
    describe(m, dev, "op:adamw8bit_step",
             {{"shape", {rows, cols}}, {"block_size", block}, {"outlier_block_scale", outlier}, {"steps", steps}},
             "param_mean_abs_error", tol::kQ8TrackReason);
    m.details["state_elements_outside_atol_rtol"] = r.state_not_close;
    m.details["state_atol"] = tol::kQ8TrackStateAtol;
    m.details["state_rtol"] = tol::kQ8TrackStateRtol;
    m.details["per_step"] = r.per_step;
    out.push_back(std::move(m));
  };
  // bitsandbytes' state check beside the parameters': both dequantised moments
  // against fp32 AdamW's, elements outside atol + rtol |m| counted.
  const std::string state_title =
      "8-bit AdamW's moments within bitsandbytes' atol/rtol, fewer than 20 elements outside (states resynced)";
  auto state_measurement = [&](Measurement m, int64_t m_rows, int64_t cols, int64_t block) {
    describe(m, dev, "op:adamw8bit_step", {{"shape", {m_rows, cols}}, {"block_size", block}, {"steps", steps}},
             "state_elements_outside_atol_rtol", tol::kQ8TrackStateReason);
    m.details["state_atol"] = tol::kQ8TrackStateAtol;
    m.details["state_rtol"] = tol::kQ8TrackStateRtol;
    m.details["elements"] = 2 * m_rows * cols;
    out.push_back(std::move(m));
  };
  auto resynced_check = [&](int64_t cols, int64_t block, const TrackResult& r) {
    emit(make_check("Q8-2", "8-bit AdamW tracks fp32 AdamW one step at a time (states resynced)", r.param_mean_abs,
                    tol::kQ8TrackParamMeanAbs),
         cols, block, 1.f, r);
    state_measurement(
        make_check("Q8-2", state_title, static_cast<double>(r.state_not_close), tol::kQ8TrackStateMaxOutside), rows,
        cols, block);
  };
  uint64_t k = 0;
  for (const int64_t cols : {int64_t{32}, int64_t{1024}, int64_t{4097}})
    resynced_check(cols, q8::kDefaultBlock,
                   track(dev, rows, cols, q8::kDefaultBlock, 1.f, warmup, steps, ctx.seed * 31 + ++k));
  const int64_t cols = 1024;
  resynced_check(cols, q8::kLargeBlock,
                 track(dev, rows, cols, q8::kLargeBlock, 1.f, warmup, steps, ctx.seed * 31 + ++k));
  // One block of gradients much larger than the rest: per-block absmax keeps the
  // other blocks' resolution; one absmax for the whole tensor does not, and blocks
  // 32 times the size leave the outlier's 31 neighbour blocks (of 256) at its scale.
  const std::string resynced = check_name("Q8-2", "8-bit AdamW tracks fp32 AdamW one step at a time (states resynced)");
  const std::string outlier = check_name("Q8-2", "8-bit AdamW tracks fp32 AdamW with one outlier block");
  const uint64_t seed = ctx.seed * 31 + ++k;
  const TrackResult ok = track(dev, rows, cols, q8::kDefaultBlock, kQ8OutlierGross, warmup, steps, seed);
  emit(make_check("Q8-2", "8-bit AdamW tracks fp32 AdamW with one outlier block", ok.param_mean_abs,
                  tol::kQ8TrackParamMeanAbs),
       cols, q8::kDefaultBlock, kQ8OutlierGross, ok);
  auto faulty = [&](ops::Q8Fault f, float scale) {
    ops::ScopedQ8Fault fault(f);
    return track(dev, rows, cols, q8::kDefaultBlock, scale, warmup, steps, seed);
  };
  ops::Q8Fault per_tensor, wide_blocks, unsigned_m;
  per_tensor.one_absmax_per_tensor = true;
  wide_blocks.block_factor = 32;
  unsigned_m.first_moment_unsigned = true;
  const TrackResult gross = faulty(per_tensor, kQ8OutlierGross);
  emit(make_negative_control("Q8-2", "negative control (gross): one absmax per tensor, one outlier block",
                             gross.param_mean_abs, tol::kQ8TrackParamMeanAbs, outlier),
       cols, rows * cols, kQ8OutlierGross, gross);
  const TrackResult wide = faulty(wide_blocks, kQ8OutlierGross);
  emit(make_subtle_control("Q8-2", "negative control (subtle): blocks of 32 x 256, one outlier block",
                           wide.param_mean_abs, tol::kQ8TrackParamMeanAbs, outlier),
       cols, 32 * q8::kDefaultBlock, kQ8OutlierGross, wide);
  // Subtle: the first moment in the unsigned map (its sign lost: negative values encode as 0).
  const TrackResult subtle = faulty(unsigned_m, 1.f);
  emit(make_subtle_control("Q8-2", "negative control (subtle): the first moment in the unsigned map",
                           subtle.param_mean_abs, tol::kQ8TrackParamMeanAbs, resynced),
       cols, q8::kDefaultBlock, 1.f, subtle);
  // The state check's gross control: the unsigned first moment, its negative half lost.
  const std::string state_check = check_name("Q8-2", state_title);
  state_measurement(
      make_negative_control("Q8-2", "negative control (gross): the first moment in the unsigned map, state check",
                            static_cast<double>(subtle.state_not_close), tol::kQ8TrackStateMaxOutside, state_check),
      rows, cols, q8::kDefaultBlock);
  // Its subtle control: the signed map's lowest code stored as zero, so a block whose
  // largest first moment is negative loses it (about half the blocks, one element each).
  // The count grows with the blocks, so the control runs on 256 of them in either
  // preset (tol::kQ8LowestCodeRows); the full preset's 4096 give about 2350, past the
  // 100x of the bound that a subtle control may be.
  ops::Q8Fault lowest;
  lowest.lowest_code_as_zero = true;
  const TrackResult lz = [&] {
    ops::ScopedQ8Fault fault(lowest);
    return track(dev, tol::kQ8LowestCodeRows, cols, q8::kDefaultBlock, 1.f, warmup, steps, seed);
  }();
  state_measurement(
      make_subtle_control("Q8-2", "negative control (subtle): the signed map's lowest code stored as zero, state check",
                          static_cast<double>(lz.state_not_close), tol::kQ8TrackStateMaxOutside, state_check),
      tol::kQ8LowestCodeRows, cols, q8::kDefaultBlock);
  return out;
}


// ---- Q8-3: a long run without resync -----------------------------------------------

// The controlled problem: least squares W X ~ Y with Y = W* X + noise, W of D x D
// (4096 elements: 8-bit state, 16 blocks of 256), N > D samples, so the loss levels
// off at the noise (about sigma^2 (1 - D/N)) rather than at zero, and the relative
// final loss compares where both optimizers settle. Loss after each step.
std::vector<double> loss_curve(Device& dev, bool eight_bit, const ops::AdamW8bitOptions& opt, int steps,
                               uint64_t seed) {
  constexpr int D = 64, N = 128;
  std::mt19937_64 rng(seed);
  const std::vector<float> w_star = randn(rng, D * D, 1.f / 8), x = randn(rng, D * N, 1.f),
                           noise = randn(rng, D * N, kQ8TargetNoise);
  std::vector<float> y(D * N);
  for (int i = 0; i < D; ++i)
    for (int n = 0; n < N; ++n) {
      double acc = 0;
      for (int k = 0; k < D; ++k) acc += static_cast<double>(w_star[i * D + k]) * x[k * N + n];
      y[i * N + n] = static_cast<float>(acc) + noise[i * N + n];
    }
  const ops::AdamWConfig cfg{kQ8LongLr, 0.9f, 0.999f, 1e-8f, 0.f};
  Tensor w = Tensor::zeros(dev, {D, D}, DType::f32, Consumer::weights);
  Tensor g = Tensor::zeros(dev, {D, D}, DType::f32, Consumer::gradients);
  const ops::AdamW8bitOptions o = ops::applied_options(opt, D * D);
  const Shape blocks{q8::block_count(D * D, o.block_size)};
  Tensor m = Tensor::zeros(dev, {D, D}, eight_bit ? DType::u8 : DType::f32, Consumer::optimizer_state);
  Tensor v = Tensor::zeros(dev, {D, D}, eight_bit ? DType::u8 : DType::f32, Consumer::optimizer_state);
  Tensor ma = Tensor::zeros(dev, blocks, DType::f32, Consumer::optimizer_state);
  Tensor va = Tensor::zeros(dev, blocks, DType::f32, Consumer::optimizer_state);
  std::vector<double> curve;
  std::vector<float> r(D * N), grad(D * D);
  for (int s = 0; s <= steps; ++s) {
    const std::vector<float> wh = w.to_host_f32();
    double loss = 0;
    for (int i = 0; i < D; ++i)
      for (int n = 0; n < N; ++n) {
        float acc = 0.f;
        for (int k = 0; k < D; ++k) acc += wh[i * D + k] * x[k * N + n];
        r[i * N + n] = acc - y[i * N + n];
        loss += static_cast<double>(r[i * N + n]) * r[i * N + n];
      }
    curve.push_back(loss / (D * N));
    if (s == steps) break;
    for (int i = 0; i < D; ++i)
      for (int k = 0; k < D; ++k) {
        float acc = 0.f;
        for (int n = 0; n < N; ++n) acc += r[i * N + n] * x[k * N + n];
        grad[i * D + k] = 2.f * acc / (D * N);
      }
    g.copy_from(Tensor::from_host(dev, grad, {D, D}, DType::f32, Consumer::workspace));
    if (eight_bit)
      ops::adamw8bit_step(w, g, m, ma, v, va, s + 1, cfg, o);
    else
      ops::adamw_step(w, g, m, v, s + 1, cfg);
  }
  return curve;
}

std::vector<Measurement> q8_long_horizon(RunContext& ctx) {
  Device& dev = ctx.device;
  std::vector<Measurement> out;
  const int steps = ctx.preset == Preset::quick ? kQ8LongStepsQuick : 500;
  const ops::AdamW8bitOptions opt;
  const std::vector<double> ref = loss_curve(dev, false, opt, steps, ctx.seed);
  // kind 0: the check; 1 and 2: its gross and subtle controls, switches of the
  // quantiser and the optimizer (ops::Q8Fault).
  auto run = [&](const ops::Q8Fault& fault, const char* label, int kind) {
    std::vector<double> got;
    {
      ops::ScopedQ8Fault f(fault);
      got = loss_curve(dev, true, opt, steps, ctx.seed);
    }
    const double rel = std::fabs(got.back() - ref.back()) / ref.back();
    const std::string title = kind == 0 ? "8-bit AdamW's final loss within 5% of fp32 AdamW's, no resync"
                                        : fmt::format("negative control ({}): {}", kind == 1 ? "gross" : "subtle", label);
    const std::string kQ8_3Check = check_name("Q8-3", "8-bit AdamW's final loss within 5% of fp32 AdamW's, no resync");
    Measurement m = kind == 0   ? make_check("Q8-3", title, rel, tol::kQ8LongHorizonRelLoss)
                    : kind == 1 ? make_negative_control("Q8-3", title, rel, tol::kQ8LongHorizonRelLoss, kQ8_3Check)
                                : make_subtle_control("Q8-3", title, rel, tol::kQ8LongHorizonRelLoss, kQ8_3Check);
    describe(m, dev, "least_squares", {{"steps", steps}, {"block_size", opt.block_size}, {"variant", label}},
             "rel_final_loss", tol::kQ8LongHorizonReason);
    m.details["final_loss_fp32"] = ref.back();
    m.details["final_loss_8bit"] = got.back();
    m.details["initial_loss"] = ref.front();
    if (kind == 0) {
      nlohmann::json x = nlohmann::json::array(), a = nlohmann::json::array(), b = nlohmann::json::array();
      const int every = std::max(1, steps / 100);
      for (size_t s = 0; s < ref.size(); s += static_cast<size_t>(every)) {
        x.push_back(s);
        a.push_back(ref[s]);
        b.push_back(got[s]);
      }
      m.details["curve"] = {{"x", x},
                            {"series", {{"fp32 AdamW", a}, {"8-bit AdamW", b}}},
                            {"x_label", "step"},
                            {"y_label", "training loss (MSE)"}};
    }
    out.push_back(std::move(m));
  };
  run(ops::Q8Fault{}, "8-bit AdamW", 0);
  ops::Q8Fault linear, unsigned_m;
  linear.linear_maps = true;
  run(linear, "linear maps for both moments", 1);
  // The first moment's sign lost (the unsigned map): every negative m encodes as 0.
  unsigned_m.first_moment_unsigned = true;
  run(unsigned_m, "the first moment in the unsigned map (its sign lost)", 2);
  return out;
}

// ---- Q8-4: state bytes -------------------------------------------------------------

// A parameter set of three 8-bit-sized tensors (one with a partial last block) and a bias.
// Q8-5 leaves out the largest, so that its subtle control changes tens of values.
void add_q8_params(ParamSet& ps, bool with_large = true) {
  if (with_large) ps.add_normal("w1", {64, 1024}, 0.02f);
  ps.add_normal("w2", {33, 257}, 0.02f);  // 8481 elements: 34 blocks, the last partial
  ps.add_normal("w3", {4096}, 0.02f);     // exactly the threshold
  ps.add_const("b", {1024}, 0.f);         // under it: fp32 state
}

// The expected bytes, from the shapes: 2 per element + 4 per block per moment for
// tensors of >= 4096 elements, 8 per element under.
double expected_q8_bytes(const ParamSet& ps, int64_t block) {
  double bytes = 0;
  for (const Param& p : ps.all()) {
    const double n = static_cast<double>(p.master.numel());
    bytes += n >= 4096 ? 2 * n + 2 * 4 * std::ceil(n / static_cast<double>(block)) : 8 * n;
  }
  return bytes;
}

std::vector<Measurement> q8_state_bytes(RunContext& ctx) {
  Device& dev = ctx.device;
  std::vector<Measurement> out;
  for (const int64_t block : {q8::kDefaultBlock, q8::kLargeBlock}) {
    OptimizerConfig oc;
    oc.kind = OptimizerKind::adamw8bit;
    oc.adamw8bit.block_size = block;
    // The 8-bit optimizer's state as built, under one of its faults (ops::Q8Fault).
    auto measure = [&](const ops::Q8Fault& fault) {
      ops::ScopedQ8Fault f(fault);
      ParamSet ps(dev, ParamStorage{}, ctx.seed);
      add_q8_params(ps);
      const size_t before = dev.memory().snapshot().current(Consumer::optimizer_state);
      const std::unique_ptr<Optimizer> o = make_optimizer(oc, ps);
      const double measured =
          static_cast<double>(dev.memory().snapshot().current(Consumer::optimizer_state) - before);
      const double expected = expected_q8_bytes(ps, block);
      return std::tuple{measured, expected, static_cast<double>(ps.numel()), static_cast<double>(o->state_bytes())};
    };
    auto emit = [&](Measurement m, const std::tuple<double, double, double, double>& r, const char* variant) {
      const auto& [measured, expected, params, reported] = r;
      describe(m, dev, "params", {{"block_size", block}, {"variant", variant}}, "rel_error", tol::kQ8StateBytesReason);
      m.details["measured_bytes"] = measured;
      m.details["expected_bytes"] = expected;
      m.details["optimizer_reported_bytes"] = reported;
      m.details["bytes_per_parameter"] = measured / params;
      m.details["fp32_adamw_bytes_per_parameter"] = 8;
      out.push_back(std::move(m));
    };
    auto rel = [](const std::tuple<double, double, double, double>& r) {
      return std::fabs(std::get<0>(r) - std::get<1>(r)) / std::get<1>(r);
    };
    const auto ok = measure(ops::Q8Fault{});
    emit(make_check("Q8-4", "8-bit AdamW state: 2 bytes per parameter + 4 per block per moment (tracker)", rel(ok),
                    tol::kQ8StateBytesRelError),
         ok, "adamw8bit");
    if (block != q8::kDefaultBlock) continue;
    ops::Q8Fault fp32, shared;
    fp32.fp32_state = true;
    shared.shared_absmax = true;
    const auto gross = measure(fp32);
    emit(make_negative_control("Q8-4", "negative control (gross): fp32 moments (8 bytes per parameter)", rel(gross),
                               tol::kQ8StateBytesRelError, check_name("Q8-4", "8-bit AdamW state: 2 bytes per parameter + 4 per block per moment (tracker)")),
         gross, "fp32 moments");
    const auto subtle = measure(shared);
    emit(make_subtle_control("Q8-4", "negative control (subtle): one absmax per block for both moments", rel(subtle),
                             tol::kQ8StateBytesRelError, check_name("Q8-4", "8-bit AdamW state: 2 bytes per parameter + 4 per block per moment (tracker)")),
         subtle, "shared absmax");
  }
  return out;
}

// ---- Q8-5: save and reload ---------------------------------------------------------

// State elements (codes, absmax, fp32 moments) that differ bitwise between two optimizers.
int64_t state_mismatches(const Optimizer& a, const Optimizer& b) {
  const auto sa = a.state(), sb = b.state();
  HR_CHECK(sa.size() == sb.size(), "Q8-5: state tensor counts differ");
  int64_t n = 0;
  for (size_t i = 0; i < sa.size(); ++i) {
    const std::vector<uint8_t> x = sa[i].second.to_host_bytes(), y = sb[i].second.to_host_bytes();
    const size_t es = dtype_size(sa[i].second.dtype());
    for (size_t e = 0; e + es <= x.size(); e += es) n += std::memcmp(&x[e], &y[e], es) != 0;
  }
  return n;
}

std::vector<Measurement> q8_save_reload(RunContext& ctx) {
  Device& dev = ctx.device;
  std::vector<Measurement> out;
  OptimizerConfig oc;
  oc.kind = OptimizerKind::adamw8bit;
  oc.adamw = ops::AdamWConfig{1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f};
  std::mt19937_64 rng(ctx.seed * 131 + 7);
  auto set_grads = [&](ParamSet& ps, uint64_t s) {
    std::mt19937_64 r(s);
    for (Param& p : ps.all())
      p.grad.copy_from(Tensor::from_host(dev, randn(r, static_cast<size_t>(p.grad.numel()), 0.01f), p.grad.shape(),
                                         DType::f32, Consumer::workspace));
  };
  ParamSet a(dev, ParamStorage{}, ctx.seed);
  add_q8_params(a, false);
  std::unique_ptr<Optimizer> oa = make_optimizer(oc, a);
  for (int64_t s = 1; s <= 3; ++s) {
    set_grads(a, rng());
    oa->step(a, s);
  }
  // Saved and reloaded by the optimizer's checkpoint (Optimizer::save / load), under
  // one of its faults (ops::Q8Fault) or none.
  auto reloaded = [&](const ops::Q8Fault& fault) {
    ops::ScopedQ8Fault f(fault);
    const Optimizer::Saved saved = oa->save();
    ParamSet b(dev, ParamStorage{}, ctx.seed);
    add_q8_params(b, false);
    std::unique_ptr<Optimizer> ob = make_optimizer(oc, b);
    ob->load(saved);
    return ob;
  };
  auto emit = [&](Measurement m, const char* variant) {
    describe(m, dev, "params", {{"variant", variant}, {"steps_before_save", 3}}, "bitwise_mismatches",
             "saving and reloading copies bytes: nothing may change (bound 0)");
    out.push_back(std::move(m));
  };
  // The next step after a reload against the next step of the original: parameters
  // and state elements that differ. Steps the original optimizer (so: last).
  const std::string next_step_check =
      check_name("Q8-5", "a step after the reload equals the step without it (parameters and state, bitwise)");
  const uint64_t gs = rng();
  auto next_step_mismatches = [&](Optimizer& ob) {
    ParamSet pa(dev, ParamStorage{}, ctx.seed), pb(dev, ParamStorage{}, ctx.seed);
    add_q8_params(pa, false);
    add_q8_params(pb, false);
    for (size_t i = 0; i < pa.size(); ++i) pb.all()[i].master.copy_from(pa.all()[i].master);
    // The original is stepped on a copy of itself, so each comparison starts from the same state.
    std::unique_ptr<Optimizer> orig = reloaded(ops::Q8Fault{});
    set_grads(pa, gs);
    set_grads(pb, gs);
    orig->step(pa, 4);
    ob.step(pb, 4);
    int64_t diff = state_mismatches(*orig, ob);
    for (size_t i = 0; i < pa.size(); ++i) {
      const std::vector<uint8_t> x = pa.all()[i].master.to_host_bytes(), y = pb.all()[i].master.to_host_bytes();
      for (size_t e = 0; e + 4 <= x.size(); e += 4) diff += std::memcmp(&x[e], &y[e], 4) != 0;
    }
    return diff;
  };
  const std::string bytes_check = check_name("Q8-5", "quantised state saved and reloaded bitwise");
  ops::Q8Fault no_absmax, requant, ulp;
  no_absmax.absmax_not_saved = true;
  requant.requantise_on_save = true;
  ulp.reload_absmax_ulp = true;
  // Gross: the absmax not saved (zeros on reload).
  emit(make_negative_control("Q8-5", "negative control (gross): the absmax not saved",
                             static_cast<double>(state_mismatches(*oa, *reloaded(no_absmax))), tol::kBitwiseMismatches,
                             bytes_check),
       "no absmax");
  // Subtle: the state saved dequantised (fp32) and quantised again on load: codes
  // survive, but a block whose largest first moment is negative gets 0.99297 times
  // its absmax (the signed map's lowest code), so ~half the first moment's absmax differ.
  emit(make_subtle_control("Q8-5", "negative control (subtle): saved dequantised, quantised again on load",
                           static_cast<double>(state_mismatches(*oa, *reloaded(requant))), tol::kBitwiseMismatches,
                           bytes_check),
       "requantised");
  emit(make_check("Q8-5", "quantised state saved and reloaded bitwise",
                  static_cast<double>(state_mismatches(*oa, *reloaded(ops::Q8Fault{}))), tol::kBitwiseMismatches),
       "bytes");
  emit(make_check("Q8-5", "a step after the reload equals the step without it (parameters and state, bitwise)",
                  static_cast<double>(next_step_mismatches(*reloaded(ops::Q8Fault{}))), tol::kBitwiseMismatches),
       "next step");
  // Subtle, aimed at the next step: one absmax one ulp up after the reload, which
  // moves the few elements of that block whose step it changes.
  emit(make_subtle_control("Q8-5", "negative control (subtle): one absmax one ulp up after the reload",
                           static_cast<double>(next_step_mismatches(*reloaded(ulp))), tol::kBitwiseMismatches,
                           next_step_check),
       "absmax one ulp up");
  return out;
}

HR_REGISTER_PROPERTY(PropertySpec{"Q8-1", "block-wise dynamic 8-bit quantisation: round trip within half a gap", 0.5,
                                  q8_round_trip, ""});
HR_REGISTER_PROPERTY(PropertySpec{"Q8-2", "8-bit AdamW tracks fp32 AdamW one step at a time", 1.0, q8_tracking, ""});
HR_REGISTER_PROPERTY(PropertySpec{"Q8-3", "8-bit AdamW over a long run: final loss within 5% of fp32 AdamW", 1.5,
                                  q8_long_horizon, ""});
HR_REGISTER_PROPERTY(PropertySpec{"Q8-4", "8-bit AdamW state bytes measured by the tracker", 0.1, q8_state_bytes, ""});
HR_REGISTER_PROPERTY(PropertySpec{"Q8-5", "8-bit AdamW state saved and reloaded exactly", 0.2, q8_save_reload, ""});

}  // namespace
}  // namespace hr::props
