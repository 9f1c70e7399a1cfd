// MP-1..MP-5 and GA-5: mixed precision in the training step, on the MLP (its
// gradients' magnitudes are set with the loss multiplier, so underflow and overflow
// are produced by the step itself, not written into a tensor). Anchors:
// docs/catalogue.md MP and GA-5; Micikevicius et al. 2018 (loss scaling, fp32 masters);
// PyTorch GradScaler's defaults for the scaler. Each property runs its gross
// negative control and a subtle one near its bound (docs/catalogue.md POWER).
#include "harness/properties/mixed_precision.hpp"

#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <map>

#include "harness/check.hpp"
#include "harness/compare.hpp"
#include "harness/properties/accum_support.hpp"
#include "harness/tolerances.hpp"
#include "kernels/common/float16.hpp"

namespace hr::props {
namespace {

// ---- Shared pieces ----

// The MLP of the accumulation properties at its quick size whatever the run's
// preset: MP-1 / MP-2's loss multiplier places this model's gradient histogram
// against fp16's range (a wider model's gradients are smaller: at the full size
// 99% would flush unscaled), and what the mechanism checks (MP-3, GA-5, MP-4)
// count, elements of one tensor, must not grow with the model.
StepConfig mp_mlp(DType dtype, int64_t micro_batch) { return accum_mlp_config(dtype, micro_batch, Preset::quick); }

StepConfig with_static_scale(StepConfig c, double scale) {
  c.precision.scaler.dynamic = false;
  c.precision.scaler.init_scale = scale;
  return c;
}

NamedValues gradients_at(Device& dev, const StepConfig& cfg, const Batch& batch) {
  TrainStep step(dev, cfg);
  step.forward_backward(batch);
  return gradient_values(step);
}

// Elements whose bits differ (NaN against the same NaN is equal), over named tensors.
double mismatching_elements(const NamedValues& a, const NamedValues& b) {
  HR_CHECK(a.size() == b.size(), "mismatching_elements: {} tensors against {}", a.size(), b.size());
  double n = 0;
  for (size_t t = 0; t < a.size(); ++t) {
    HR_CHECK(a[t].second.size() == b[t].second.size(), "mismatching_elements: sizes of '{}' differ", a[t].first);
    for (size_t i = 0; i < a[t].second.size(); ++i)
      n += std::memcmp(&a[t].second[i], &b[t].second[i], sizeof(float)) != 0 ? 1 : 0;
  }
  return n;
}

// Parameters (fp32 masters and 16-bit compute copies) and optimizer state.
NamedValues state_values(TrainStep& step) {
  NamedValues out = parameter_values(step);
  for (const Param& p : step.params().all())
    if (p.compute.data() != p.master.data()) out.emplace_back(p.name + ".compute", p.compute.to_host_f32());
  for (const auto& [name, t] : step.optimizer().state()) out.emplace_back("opt." + name, t.to_host_f32());
  return out;
}

// How the fp32 gradients' non-zero values fare in a 16-bit format after scaling.
struct Underflow {
  int64_t nonzero = 0;
  int64_t flushed = 0;  // non-zero in fp32, zero once stored (after the scale)
  double fraction() const { return nonzero > 0 ? static_cast<double>(flushed) / static_cast<double>(nonzero) : NAN; }
};

Underflow underflow_of(const NamedValues& g32, DType storage, double scale) {
  Underflow u;
  for (const auto& [name, v] : g32)
    for (float x : v) {
      if (x == 0.f) continue;
      ++u.nonzero;
      const float scaled = static_cast<float>(static_cast<double>(x) * scale);
      const float stored = storage == DType::f16 ? round_to<half_t>(scaled) : round_to<bfloat16_t>(scaled);
      u.flushed += stored == 0.f ? 1 : 0;
    }
  return u;
}

// Non-zero fp32 values that a real 16-bit run lost: left at exactly zero, or off by
// more than half their own size (a value built from intermediates that underflowed
// in the backward's 16-bit tensors). Values under floor_rms of their tensor's RMS
// are not counted: they can be sums that cancel, which 16-bit rounding of their
// terms alone moves by half.
Underflow lost_in_run(const NamedValues& g32, const NamedValues& g16, double floor_rms = tol::kMpLostValueFloorRms) {
  Underflow u;
  for (size_t t = 0; t < g32.size(); ++t) {
    double ss = 0;
    for (float x : g32[t].second) ss += static_cast<double>(x) * x;
    const double rms = std::sqrt(ss / static_cast<double>(std::max<size_t>(g32[t].second.size(), 1)));
    for (size_t i = 0; i < g32[t].second.size(); ++i) {
      const float x = g32[t].second[i], y = g16[t].second[i];
      if (x == 0.f || std::fabs(static_cast<double>(x)) < floor_rms * rms) continue;
      ++u.nonzero;
      u.flushed += (y == 0.f || std::fabs(static_cast<double>(y) - x) > 0.5 * std::fabs(static_cast<double>(x))) ? 1 : 0;
    }
  }
  return u;
}

// Non-zero fp32 values that a real 16-bit run left at exactly zero.
Underflow zeros_in_run(const NamedValues& g32, const NamedValues& g16) {
  Underflow u;
  for (size_t t = 0; t < g32.size(); ++t)
    for (size_t i = 0; i < g32[t].second.size(); ++i) {
      if (g32[t].second[i] == 0.f) continue;
      ++u.nonzero;
      u.flushed += g16[t].second[i] == 0.f ? 1 : 0;
    }
  return u;
}

// Histogram of the binary exponents (floor(log2 |g|)) of the non-zero values.
nlohmann::json exponent_histogram(const NamedValues& g32, int64_t* below_2m24, int64_t* below_2m14) {
  std::map<int, int64_t> h;
  *below_2m24 = *below_2m14 = 0;
  for (const auto& [name, v] : g32)
    for (float x : v) {
      if (x == 0.f || !std::isfinite(x)) continue;
      const int e = std::ilogb(x);
      ++h[e];
      if (e < -24) ++*below_2m24;
      if (e < -14) ++*below_2m14;
    }
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [e, n] : h) j[std::to_string(e)] = n;
  return j;
}

nlohmann::json mp_config(double loss_scale) {
  return nlohmann::json{{"loss_multiplier", kMpLossMultiplier}, {"loss_scale", loss_scale}};
}


// The fp32 gradients MP-1 and MP-2 measure against, and the batch.
struct Reference {
  StepConfig cfg32;
  Batch batch;
  NamedValues g32;
};

Reference mp_reference(Device& dev, Preset preset, uint64_t seed) {
  Reference r{mp_mlp(DType::f32, kEffectiveBatch), Batch{}, {}};
  r.cfg32.loss_multiplier = kMpLossMultiplier;
  r.batch = accum_batch(dev, r.cfg32, seed);
  r.g32 = gradients_at(dev, r.cfg32, r.batch);
  return r;
}

StepConfig at_dtype(StepConfig c, DType d) {
  c.precision.compute = d;
  return c;
}

}  // namespace

// ---- MP-1 ----
namespace {
// The details of an MP-1/MP-2 measurement on the real 16-bit step's lost gradient
// values (lost_in_run) or its gradients against fp32 (compare_tensors): `base`, the
// counts or the per-tensor errors, and the fault if any.
nlohmann::json lost_details(nlohmann::json base, const Underflow& u, const char* fault) {
  base["lost"] = u.flushed;
  base["counted_values"] = u.nonzero;
  if (*fault) base["fault"] = fault;
  return base;
}
nlohmann::json error_details(nlohmann::json base, const TensorsCompare& t, const char* fault) {
  base["worst_tensor"] = t.worst;
  base["per_tensor_rel_l2"] = t.per_tensor;
  if (*fault) base["fault"] = fault;
  return base;
}

constexpr const char* kMp1ErrorTitle = "unscaled gradients of the fp16 step at loss scale 2^16 match fp32";
constexpr const char* kMp1LostTitle = "with loss scale 2^16 the fp16 step loses almost no gradient value";
constexpr const char* kMp2LostTitle = "the bf16 step loses almost no gradient value without a loss scale";
constexpr const char* kMp2ErrorTitle = "gradients of the bf16 step match fp32 without a loss scale";
}  // namespace

std::vector<Measurement> mp1_fp16_underflow(Device& dev, Preset preset, uint64_t seed) {
  std::vector<Measurement> out;
  const Reference ref = mp_reference(dev, preset, seed);
  const double scale = tol::kMpLossScale;
  int64_t below24 = 0, below14 = 0;
  const nlohmann::json hist = exponent_histogram(ref.g32, &below24, &below14);
  const Underflow plain = underflow_of(ref.g32, DType::f16, 1.0);
  const Underflow scaled = underflow_of(ref.g32, DType::f16, scale);

  // The real fp16 steps: unscaled and scaled, their gradients against fp32.
  const StepConfig cfg16 = at_dtype(ref.cfg32, DType::f16);
  // The controls are the scaler's fault switch: the same step, its scale held at 1
  // (no loss scale) or at 2^2 (too small to lift the tail).
  const StepConfig scaled_cfg = with_static_scale(cfg16, scale);
  StepConfig plain_cfg = scaled_cfg, small_cfg = scaled_cfg;
  plain_cfg.precision.scaler.fault_fixed_scale = 1.0;
  small_cfg.precision.scaler.fault_fixed_scale = tol::kMpSubtleLossScale;
  const NamedValues g_plain = gradients_at(dev, plain_cfg, ref.batch);
  const NamedValues g_scaled = gradients_at(dev, scaled_cfg, ref.batch);
  const NamedValues g_small = gradients_at(dev, small_cfg, ref.batch);
  const TensorsCompare c_scaled = compare_tensors(g_scaled, ref.g32);
  const TensorsCompare c_plain = compare_tensors(g_plain, ref.g32);
  const TensorsCompare c_small = compare_tensors(g_small, ref.g32);
  const Underflow lost_plain = lost_in_run(ref.g32, g_plain), lost_scaled = lost_in_run(ref.g32, g_scaled),
                  lost_small = lost_in_run(ref.g32, g_small);
  const Underflow run_plain = zeros_in_run(ref.g32, g_plain), run_scaled = zeros_in_run(ref.g32, g_scaled);

  nlohmann::json details{{"exponent_histogram", hist},
                         {"nonzero_values", plain.nonzero},
                         {"fraction_below_2^-24", static_cast<double>(below24) / static_cast<double>(plain.nonzero)},
                         {"fraction_below_2^-14", static_cast<double>(below14) / static_cast<double>(plain.nonzero)},
                         {"flushed_fraction_unscaled", plain.fraction()},
                         {"flushed_fraction_scaled", scaled.fraction()},
                         {"loss_scale", scale},
                         {"run_zero_fraction_unscaled", run_plain.fraction()},
                         {"run_zero_fraction_scaled", run_scaled.fraction()},
                         {"run_rel_l2_unscaled", json_number(c_plain.max_rel_l2)},
                         {"run_rel_l2_scaled", json_number(c_scaled.max_rel_l2)},
                         {"anchor", "Micikevicius et al. 2018: ~5% of weight gradients under 2^-24"}};

  // The fp32 gradients' exponents and what storing them in fp16 would flush (IEEE
  // arithmetic, the same on every machine) are the details; the checks judge the
  // real fp16 step's gradients.
  const double small = tol::kMpSubtleLossScale;
  details["flushed_fraction_at_2^2"] = underflow_of(ref.g32, DType::f16, small).fraction();
  const char* held_at_1 = "the scaler's scale held at 1 (LossScalerConfig::fault_fixed_scale)";
  const char* held_small = "the scaler's scale held at 2^2 (LossScalerConfig::fault_fixed_scale)";
  CheckFamily lost(out, dev, DType::f16, "mlp", "MP-1", kMp1LostTitle, tol::kMpUnderflowFraction, "lost_fraction",
                   tol::kMpUnderflowFractionReason);
  lost.check(lost_scaled.fraction(), mp_config(scale), lost_details(details, lost_scaled, ""));
  lost.gross("the fp16 step with its loss scale held at 1 loses gradient values", lost_plain.fraction(),
             mp_config(1.0), lost_details(details, lost_plain, held_at_1));
  lost.subtle(fmt::format("the fp16 step with its loss scale held at 2^{} loses gradient values", std::ilogb(small)),
              lost_small.fraction(), mp_config(small), lost_details(details, lost_small, held_small));

  CheckFamily error(out, dev, DType::f16, "mlp", "MP-1", kMp1ErrorTitle, tol::kMpGradRelL2(DType::f16),
                    "max_tensor_rel_l2", tol::kMpGradRelL2Reason);
  auto zeros = [](const Underflow& u) { return nlohmann::json{{"run_zero_fraction", u.fraction()}}; };
  error.check(c_scaled.max_rel_l2, mp_config(scale), error_details(zeros(run_scaled), c_scaled, ""));
  error.gross("the fp16 step without a loss scale is flagged", c_plain.max_rel_l2, mp_config(1.0),
              error_details(zeros(run_plain), c_plain, held_at_1));
  error.subtle(fmt::format("the fp16 step at a loss scale held at 2^{} is flagged", std::ilogb(small)),
               c_small.max_rel_l2, mp_config(small),
               error_details(zeros(zeros_in_run(ref.g32, g_small)), c_small, held_small));
  return out;
}

// ---- MP-2 ----
std::vector<Measurement> mp2_bf16_range(Device& dev, Preset preset, uint64_t seed) {
  std::vector<Measurement> out;
  const Reference ref = mp_reference(dev, preset, seed);
  const StepConfig cfg_bf = at_dtype(ref.cfg32, DType::bf16);
  const NamedValues g_bf = gradients_at(dev, cfg_bf, ref.batch);
  const TensorsCompare c = compare_tensors(g_bf, ref.g32);
  const Underflow lost = lost_in_run(ref.g32, g_bf);
  // The controls are faults of the same step: it computes in fp16 although bf16 was
  // asked for (PrecisionConfig::fault_compute_fp16), with its loss scale held at 1
  // (gross) or at 2^2 (subtle).
  const double small = tol::kMpSubtleLossScale;
  auto fp16_by_mistake = [&](double held_scale) {
    StepConfig b = cfg_bf;
    b.precision.fault_compute_fp16 = true;
    b.precision.scaler.fault_fixed_scale = held_scale;
    return gradients_at(dev, b, ref.batch);
  };
  const NamedValues g_plain = fp16_by_mistake(1.0), g_small = fp16_by_mistake(small);
  const nlohmann::json host{{"flushed_fraction_bf16_storage", underflow_of(ref.g32, DType::bf16, 1.0).fraction()},
                            {"flushed_fraction_fp16_storage", underflow_of(ref.g32, DType::f16, 1.0).fraction()}};
  const char* gross_fault = "fp16 computed for bf16, scale held at 1 (fault_compute_fp16, fault_fixed_scale)";
  const char* subtle_fault = "fp16 computed for bf16, scale held at 2^2 (fault_compute_fp16, fault_fixed_scale)";
  const Underflow lost_plain = lost_in_run(ref.g32, g_plain), lost_small = lost_in_run(ref.g32, g_small);
  CheckFamily lost_values(out, dev, DType::bf16, "mlp", "MP-2", kMp2LostTitle, tol::kMpUnderflowFraction,
                          "lost_fraction", tol::kMpUnderflowFractionReason);
  lost_values.check(lost.fraction(), mp_config(1.0), lost_details(host, lost, ""));
  lost_values.gross("the step computing in fp16 by mistake, unscaled, loses gradient values", lost_plain.fraction(),
                    mp_config(1.0), lost_details(host, lost_plain, gross_fault));
  lost_values.subtle(
      fmt::format("the step computing in fp16 by mistake at a loss scale of 2^{} loses gradient values",
                  std::ilogb(small)),
      lost_small.fraction(), mp_config(small), lost_details(host, lost_small, subtle_fault));

  const TensorsCompare c_plain = compare_tensors(g_plain, ref.g32), c_small = compare_tensors(g_small, ref.g32);
  CheckFamily error(out, dev, DType::bf16, "mlp", "MP-2", kMp2ErrorTitle, tol::kMpGradRelL2(DType::bf16),
                    "max_tensor_rel_l2", tol::kMpGradRelL2Reason);
  const nlohmann::json none = nlohmann::json::object();
  error.check(c.max_rel_l2, mp_config(1.0), error_details(none, c, ""));
  error.gross("the step computing in fp16 by mistake, unscaled, is flagged", c_plain.max_rel_l2, mp_config(1.0),
              error_details(none, c_plain, gross_fault));
  error.subtle(fmt::format("the step computing in fp16 by mistake at a loss scale of 2^{} is flagged",
                           std::ilogb(small)),
               c_small.max_rel_l2, mp_config(small), error_details(none, c_small, subtle_fault));
  return out;
}

// ---- MP-3 ----
namespace {

// The mechanism checks' configuration: the quick MLP in fp16, AdamW (so the
// optimizer has state to leave untouched), 4 micro-batches of 8.
StepConfig scaler_config(Preset preset) {
  StepConfig c = mp_mlp(DType::f16, kEffectiveBatch / 4);
  c.optimizer.kind = OptimizerKind::adamw;
  return c;
}

// Makes micro-batch `m` of a window of K overflow in fp16 for real: its loss is
// multiplied by 2^24, so at the scale 2^16 its loss gradient (~2^-9 of the loss
// per output element) exceeds fp16's 65504 and is stored as inf. The fp32 step
// takes the same multiplier without an inf (checked in the details).
std::vector<double> overflow_at(int64_t K, int64_t m, double factor = tol::kMpOverflowMultiplier) {
  std::vector<double> f(static_cast<size_t>(K), 1.0);
  f[static_cast<size_t>(m)] = factor;
  return f;
}

struct Injection {
  std::string where;  // a parameter's name or "loss"
  float value;        // inf or NaN
};

// One step with an inf / NaN injected; counts what a correct scaler must not do:
// state elements changed, the step not skipped, the scale not backed off, the
// growth counter not reset.
nlohmann::json inject_once(TrainStep& step, const Batch& batch, const Injection& inj, double* violations) {
  const NamedValues before = state_values(step);
  const double scale0 = step.scaler().scale();
  const double expected_scale = scale0 * step.config().precision.scaler.backoff;
  step.zero_grad();
  if (inj.where == "loss") {
    // One target of the first micro-batch is inf / NaN: that micro-batch's loss is
    // inf / NaN, and so is the loss gradient of its row.
    Batch bad = batch;
    std::vector<float> t = batch.targets_f32.to_host_f32();
    t[0] = inj.value;
    bad.targets_f32 = Tensor::from_host(step.device(), t, batch.targets_f32.shape(), DType::f32, Consumer::workspace);
    step.accumulate(bad);
  } else {
    step.accumulate(batch);
  }
  if (inj.where != "loss") {
    Tensor g = step.grad(inj.where);
    std::vector<float> v = g.to_host_f32();
    v[v.size() / 2] = inj.value;
    g.copy_from(Tensor::from_host(step.device(), v, g.shape(), DType::f32, Consumer::workspace));
  }
  const StepResult r = step.apply();
  const double changed = mismatching_elements(before, state_values(step));
  const double v = changed + (r.skipped ? 0 : 1) + (step.scaler().scale() == expected_scale ? 0 : 1) +
                   (step.scaler().growth_tracker() == 0 ? 0 : 1);
  *violations += v;
  return nlohmann::json{{"where", inj.where},       {"value", std::isnan(inj.value) ? "nan" : "inf"},
                        {"skipped", r.skipped},      {"state_elements_changed", changed},
                        {"scale_before", scale0},    {"scale_after", step.scaler().scale()},
                        {"growth_tracker", step.scaler().growth_tracker()}, {"violations", v}};
}

// Every trainable tensor and the loss, inf then NaN; returns the violations.
double injection_sweep(Device& dev, const StepConfig& cfg, const Batch& batch, nlohmann::json* log) {
  TrainStep step(dev, cfg);
  HR_CHECK(!step.step(batch).skipped, "MP-3: the clean first step overflowed at scale {}", cfg.precision.scaler.init_scale);
  std::vector<Injection> injections;
  for (float value : {std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
    for (const auto& [name, g] : step.gradients()) injections.push_back({name, value});
    injections.push_back({"loss", value});
  }
  double violations = 0;
  *log = nlohmann::json::array();
  for (const Injection& inj : injections) {
    // A clean step between injections: the growth counter is non-zero before each.
    step.step(batch);
    log->push_back(inject_once(step, batch, inj, &violations));
  }
  return violations;
}

// GradScaler's rule written out: the scale each step runs at and whether it is
// skipped, given which steps overflow.
struct Trajectory {
  std::vector<double> scale;
  std::vector<bool> skipped;
};
Trajectory expected_trajectory(const LossScalerConfig& c, const std::vector<bool>& overflow) {
  Trajectory t;
  double scale = c.init_scale;
  int64_t clean = 0;
  for (bool o : overflow) {
    t.scale.push_back(scale);
    t.skipped.push_back(o);
    if (o) {
      scale *= c.backoff;
      clean = 0;
    } else if (++clean == c.growth_interval) {
      scale *= c.growth;
      clean = 0;
    }
  }
  return t;
}

std::vector<bool> trajectory_overflows() {
  std::vector<bool> o(tol::kMpTrajectorySteps, false);
  for (int64_t s : tol::kMpTrajectoryOverflowSteps) o[static_cast<size_t>(s)] = true;
  return o;
}

// Runs the trajectory (a real overflow in micro-batch 1 at the chosen steps) and
// counts the steps whose scale or skip differ from GradScaler's rule.
double run_trajectory(Device& dev, const StepConfig& cfg, const Batch& batch, nlohmann::json* traj) {
  const std::vector<bool> overflow = trajectory_overflows();
  const Trajectory want = expected_trajectory(cfg.precision.scaler, overflow);
  TrainStep step(dev, cfg);
  double mismatches = 0;
  nlohmann::json scale = nlohmann::json::array(), skipped = nlohmann::json::array(),
                 expected = nlohmann::json::array();
  for (size_t i = 0; i < overflow.size(); ++i) {
    step.set_micro_batch_multipliers(overflow[i] ? overflow_at(cfg.accum_steps(), 1) : std::vector<double>{});
    const StepResult r = step.step(batch);
    scale.push_back(r.loss_scale);
    skipped.push_back(r.skipped);
    expected.push_back(want.scale[i]);
    mismatches += (r.loss_scale == want.scale[i] && r.skipped == want.skipped[i]) ? 0 : 1;
  }
  // scale[i] is the scale step i's backward passes ran at, before that step's
  // update (scale[0] = init_scale); final_scale is the scale after the last update.
  *traj = nlohmann::json{{"scale", scale},
                         {"scale_is", "the scale each step's backward ran at, before its update"},
                         {"init_scale", cfg.precision.scaler.init_scale},
                         {"skipped", skipped},
                         {"expected_scale", expected},
                         {"growth_interval", cfg.precision.scaler.growth_interval},
                         {"final_scale", step.scaler().scale()}};
  return mismatches;
}

// What GradScaler's defaults (2^16, growth 2.0, backoff 0.5, interval 2000, dynamic)
// make a scaler do, against what a scaler built with `c` does: its first scale, the
// scale after an overflow, after 1999 clean steps from there and after the 2000th,
// and whether it is dynamic at all. Returns the behaviours that differ.
double default_behaviour(const LossScalerConfig& c, nlohmann::json* seen) {
  DynamicLossScaler s(c);
  const double first = s.scale();
  s.update(true);
  const double backed_off = s.scale();
  for (int i = 0; i < 1999; ++i) s.update(false);
  const double after_1999 = s.scale();
  s.update(false);
  const double after_2000 = s.scale();
  const bool dynamic = c.enabled && c.dynamic;
  *seen = nlohmann::json{{"first_scale", first},       {"after_overflow", backed_off}, {"after_1999_clean", after_1999},
                         {"after_2000_clean", after_2000}, {"dynamic", dynamic}};
  return (first == 65536.0 ? 0 : 1) + (backed_off == 32768.0 ? 0 : 1) + (after_1999 == 32768.0 ? 0 : 1) +
         (after_2000 == 65536.0 ? 0 : 1) + (dynamic ? 0 : 1);
}

// Updates (p_T - p0) of T SGD steps on T batches, the steps in `skip` left out
// (fp32) or made to overflow (fp16).
NamedValues updates_over(Device& dev, StepConfig cfg, const std::vector<Batch>& batches, int64_t overflow_step,
                         bool leave_out) {
  TrainStep step(dev, cfg);
  const NamedValues p0 = parameter_values(step);
  for (size_t i = 0; i < batches.size(); ++i) {
    const bool hit = static_cast<int64_t>(i) == overflow_step;
    if (hit && leave_out) continue;
    step.set_micro_batch_multipliers(hit ? overflow_at(cfg.accum_steps(), 1) : std::vector<double>{});
    step.step(batches[i]);
  }
  NamedValues p = parameter_values(step);
  for (size_t t = 0; t < p.size(); ++t)
    for (size_t i = 0; i < p[t].second.size(); ++i) p[t].second[i] -= p0[t].second[i];
  return p;
}

}  // namespace

std::vector<Measurement> mp3_loss_scaler(Device& dev, Preset preset, uint64_t seed) {
  std::vector<Measurement> out;
  // GradScaler's defaults, as a scaler built with the default configuration behaves
  // (default_behaviour); its controls are the scaler's own switches: a scale held
  // at 1 (gross), growth one clean step late (subtle: one behaviour of five).
  {
    CheckFamily defaults(out, dev, DType::f16, "mlp", "MP-3",
                         "the scaler's defaults are GradScaler's (2^16, 2.0, 0.5, 2000)", tol::kBitwiseMismatches,
                         "behaviours_differing", "MP-3: PyTorch GradScaler's defaults, exactly");
    nlohmann::json seen;
    double wrong = default_behaviour(LossScalerConfig{}, &seen);
    defaults.check(wrong, nlohmann::json::object(), seen);
    LossScalerConfig held;
    held.fault_fixed_scale = 1;
    wrong = default_behaviour(held, &seen);
    defaults.gross("a default scaler held at a scale of 1 is flagged", wrong, {{"fault", "fixed_scale 1"}}, seen);
    LossScalerConfig late;
    late.fault_growth_off_by_one = true;
    wrong = default_behaviour(late, &seen);
    defaults.subtle("a default scaler growing one clean step late is flagged", wrong, {{"fault", "growth_off_by_one"}},
                    seen);
  }

  StepConfig cfg = scaler_config(preset);
  cfg.precision.scaler.growth_interval = tol::kMpGrowthInterval;
  const Batch batch = accum_batch(dev, cfg, seed);

  // Injected inf / NaN into every gradient tensor and the loss.
  {
    CheckFamily skip(out, dev, DType::f16, "mlp", "MP-3",
                     "an inf or NaN in any gradient tensor or the loss skips the step untouched",
                     tol::kBitwiseMismatches, "violations", tol::kMpScalerReason);
    nlohmann::json log;
    const double v = injection_sweep(dev, cfg, batch, &log);
    skip.check(v, {{"growth_interval", cfg.precision.scaler.growth_interval}, {"injections", log.size()}},
               {{"injections", log}});

    StepConfig broken = cfg;
    broken.precision.overflow_fault = OverflowFault::no_skip;
    skip.gross("a step that applies non-finite gradients is flagged", injection_sweep(dev, broken, batch, &log),
               {{"overflow_fault", "no_skip"}});

    // Subtle: the step is skipped and untouched, but the growth counter survives the
    // overflow: one violation per injection.
    StepConfig kept = cfg;
    kept.precision.scaler.fault_tracker_kept = true;
    skip.subtle("an overflow that leaves the growth counter is flagged", injection_sweep(dev, kept, batch, &log),
                {{"fault", "tracker_kept"}});
  }

  // The trajectory: backoff at each overflow, growth after the interval.
  {
    CheckFamily trajectory(out, dev, DType::f16, "mlp", "MP-3",
                           "the scale backs off at each overflow and grows after the interval",
                           tol::kBitwiseMismatches, "steps_differing", tol::kMpScalerReason);
    nlohmann::json traj;
    const double mism = run_trajectory(dev, cfg, batch, &traj);
    trajectory.check(mism, {{"growth_interval", cfg.precision.scaler.growth_interval}, {"steps", tol::kMpTrajectorySteps}},
                     {{"trajectory", traj}});

    StepConfig late = cfg;
    late.precision.scaler.fault_growth_off_by_one = true;
    const double late_mism = run_trajectory(dev, late, batch, &traj);
    trajectory.subtle("growing one clean step late (an off-by-one counter) is flagged", late_mism,
                      {{"fault", "growth_off_by_one"}}, {{"trajectory", traj}});

    StepConfig stuck = cfg;
    stuck.precision.scaler.fault_no_backoff = true;
    trajectory.gross("a scale that never backs off is flagged", run_trajectory(dev, stuck, batch, &traj),
                     {{"fault", "no_backoff"}});
  }

  // One overflow in a run of SGD steps equals fp32 leaving that step out.
  {
    StepConfig c16 = cfg;
    c16.optimizer.kind = OptimizerKind::sgd;
    c16.optimizer.sgd.lr = 0.1f;
    c16.precision.scaler.growth_interval = 2000;
    StepConfig c32 = c16;
    c32.precision.compute = DType::f32;
    std::vector<Batch> batches;
    for (int64_t i = 0; i < tol::kMpEquivalenceSteps; ++i)
      batches.push_back(accum_batch(dev, cfg, seed * 1000 + static_cast<uint64_t>(i)));
    const int64_t hit = tol::kMpEquivalenceSteps / 2;
    const NamedValues u16 = updates_over(dev, c16, batches, hit, false);
    const NamedValues u32 = updates_over(dev, c32, batches, hit, true);
    const NamedValues u32_all = updates_over(dev, c32, batches, -1, false);
    CheckFamily equal(out, dev, DType::f16, "mlp", "MP-3", "a run with one overflowing step equals fp32 skipping that step",
                      tol::kMpGradRelL2(DType::f16), "max_tensor_update_rel_l2", tol::kMpGradRelL2Reason);
    const nlohmann::json config{{"steps", tol::kMpEquivalenceSteps}, {"overflow_step", hit}, {"optimizer", "sgd"}};
    const TensorsCompare c = compare_tensors(u16, u32);
    equal.check(c.max_rel_l2, config, {{"worst_tensor", c.worst}, {"per_tensor_rel_l2", c.per_tensor}});

    nlohmann::json all_steps = config;
    all_steps["fp32_skips"] = false;
    equal.gross("against fp32 applying every step, the skipped step is seen", compare_tensors(u16, u32_all).max_rel_l2,
                all_steps);

    // Subtle, a switch of the step: the overflowing micro-batch dropped and the other
    // K - 1 applied, so the skipped step moves the parameters by (K-1)/K of an update.
    StepConfig dropped = c16;
    dropped.precision.overflow_fault = OverflowFault::skip_micro_batch;
    nlohmann::json dropped_config = config;
    dropped_config["overflow_fault"] = "skip_micro_batch";
    equal.subtle("a step applying all but the overflowing micro-batch is seen",
                 compare_tensors(updates_over(dev, dropped, batches, hit, false), u32).max_rel_l2, dropped_config);
  }
  return out;
}

// ---- GA-5 ----
namespace {

constexpr const char* kGa5UnscaleTitle = "gradients are unscaled once per step, not per micro-batch";
constexpr const char* kGa5ScaleTitle = "every micro-batch of the window backpropagates at the window's loss scale";

// One window's gradients as the buffers show them: read at every micro-batch's
// forward end (the sum of those before it) and after the window, flat, in parameter
// order. `per_micro_batch[j]` is what micro-batch j added; `total` the buffer after
// the window. The step is left accumulated, not applied.
struct Contributions {
  std::vector<std::vector<float>> per_micro_batch;
  std::vector<float> total;
};
Contributions contributions(TrainStep& step, const Batch& b) {
  auto flat = [&step] {
    std::vector<float> v;
    for (const auto& [n, g] : gradient_values(step)) v.insert(v.end(), g.begin(), g.end());
    return v;
  };
  std::vector<std::vector<float>> snaps;
  step.set_forward_end_hook([&](int64_t) { snaps.push_back(flat()); });
  step.zero_grad();
  step.accumulate(b);
  step.set_forward_end_hook({});
  Contributions c;
  c.total = flat();
  snaps.push_back(c.total);
  for (size_t j = 0; j + 1 < snaps.size(); ++j) {
    std::vector<float> d(snaps[j + 1].size());
    for (size_t i = 0; i < d.size(); ++i) d[i] = snaps[j + 1][i] - snaps[j][i];
    c.per_micro_batch.push_back(std::move(d));
  }
  return c;
}

// The least-squares factor between a scaled contribution and the unscaled one
// (<g, r> / <r, r>); NaN when the scaled one is not finite (an overflow).
double scale_ratio(const std::vector<float>& scaled, const std::vector<float>& ref) {
  double gr = 0, rr = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    gr += static_cast<double>(scaled[i]) * ref[i];
    rr += static_cast<double>(ref[i]) * ref[i];
  }
  return std::isfinite(gr) && rr > 0 ? gr / rr : NAN;
}

// `to` takes `from`'s fp32 master weights (the same parameters, another precision).
void copy_masters(TrainStep& from, TrainStep& to) {
  auto& a = from.params().all();
  auto& b = to.params().all();
  HR_CHECK(a.size() == b.size(), "copy_masters: {} parameters against {}", a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) b[i].master.copy_from(a[i].master);
  to.params().sync_compute();
}

}  // namespace

std::vector<Measurement> ga5_overflow_in_window(Device& dev, Preset preset, uint64_t seed) {
  std::vector<Measurement> out;
  StepConfig cfg = scaler_config(preset);
  cfg.optimizer.kind = OptimizerKind::sgd;
  const int64_t K = cfg.accum_steps();
  const Batch b1 = accum_batch(dev, cfg, seed), b2 = accum_batch(dev, cfg, seed + 1),
              b3 = accum_batch(dev, cfg, seed + 2);

  // The overflow is real: fp32 takes the same multiplier without an inf.
  StepConfig c32 = cfg;
  c32.precision.compute = DType::f32;
  bool fp32_finite = true;
  {
    TrainStep s32(dev, c32);
    s32.set_micro_batch_multipliers(overflow_at(K, 2));
    s32.forward_backward(b2);
    for (const auto& [n, v] : gradient_values(s32))
      for (float x : v) fp32_finite = fp32_finite && std::isfinite(x);
  }

  struct Window {
    double skip_violations = 0;  // window 2: state changed, not skipped, scale not halved
    double leaked = 0;           // window 3's gradients against a fresh step's at the same state
    double unscale_error = 0;    // window 3's unscaled gradients against fp32's at the same parameters
    double scale_violations = 0; // micro-batches of windows 1 and 3 whose gradients are not at the window's scale
    nlohmann::json details;
  };
  // The scales the windows must run at, by GradScaler's rule from the configuration:
  // window 1 at the initial scale, window 3 at it times the backoff (window 2 overflowed).
  const double s1 = cfg.precision.scaler.init_scale, s3 = s1 * cfg.precision.scaler.backoff;
  // A window's micro-batches measured from their gradients: each one's scaled
  // contribution against an fp32 step's at the same parameters (no scale), their
  // least-squares ratio against the window's scale. Leaves `step` accumulated.
  auto scales_seen = [&](TrainStep& step, const Batch& b, double expected, int64_t* off, nlohmann::json* ratios) {
    StepConfig ref_cfg = c32;
    ref_cfg.loss_multiplier = step.config().loss_multiplier;
    TrainStep r32(dev, ref_cfg);
    copy_masters(step, r32);
    const Contributions got = contributions(step, b), ref = contributions(r32, b);
    HR_CHECK(got.per_micro_batch.size() == ref.per_micro_batch.size(), "GA-5: {} micro-batches against {}",
             got.per_micro_batch.size(), ref.per_micro_batch.size());
    for (size_t j = 0; j < got.per_micro_batch.size(); ++j) {
      const double ratio = scale_ratio(got.per_micro_batch[j], ref.per_micro_batch[j]);
      ratios->push_back(ratio);
      *off += std::fabs(ratio / expected - 1.0) <= tol::kGa5ScaleRelTol ? 0 : 1;
    }
    return ref.total;
  };
  auto run = [&](const StepConfig& c) {
    Window w;
    TrainStep step(dev, c);
    TrainStep ref(dev, c);  // the same steps without the overflowing window
    int64_t off = 0;
    nlohmann::json ratios1 = nlohmann::json::array(), ratios3 = nlohmann::json::array();
    scales_seen(step, b1, s1, &off, &ratios1);
    step.apply();
    ref.step(b1);
    const NamedValues before = state_values(step);
    const double scale0 = step.scaler().scale();
    step.set_micro_batch_multipliers(overflow_at(K, 2));
    const StepResult r2 = step.step(b2);
    step.set_micro_batch_multipliers({});
    nlohmann::json scales = step.micro_batch_scales();  // the step's own record, for the details
    const double changed = mismatching_elements(before, state_values(step));
    w.skip_violations = changed + (r2.skipped ? 0 : 1) + (step.scaler().scale() == scale0 * c.precision.scaler.backoff ? 0 : 1);
    // The reference backs off as the skipped window did, without running it.
    ref.scaler().update(true);
    const std::vector<float> fp32_grads = scales_seen(step, b3, s3, &off, &ratios3);
    const StepResult r3 = step.apply();
    w.scale_violations = static_cast<double>(off);
    // Unscaled once: the step's gradients after the window, in real units, against
    // the fp32 gradients of the same parameters and batch.
    std::vector<float> unscaled;
    for (const auto& [n, v] : gradient_values(step)) unscaled.insert(unscaled.end(), v.begin(), v.end());
    w.unscale_error = rel_l2(unscaled, fp32_grads);
    ref.forward_backward(b3);
    w.leaked = mismatching_elements(gradient_values(step), gradient_values(ref));
    w.details = nlohmann::json{{"window2_skipped", r2.skipped},
                               {"window2_state_elements_changed", changed},
                               {"scale_before", scale0},
                               {"scale_after", step.scaler().scale()},
                               {"window3_skipped", r3.skipped},
                               {"window3_gradient_elements_differing", w.leaked},
                               {"window1_scale_seen_per_micro_batch", ratios1},
                               {"window3_scale_seen_per_micro_batch", ratios3},
                               {"window_scales_expected", {s1, s3}},
                               {"window3_unscaled_rel_l2_vs_fp32", w.unscale_error},
                               {"unscale_passes", step.unscale_passes()},
                               {"window2_micro_batch_scales_recorded", scales},
                               {"steps", 3},
                               {"micro_batches_per_step", K},
                               {"overflow_micro_batch", 2},
                               {"overflow_multiplier", tol::kMpOverflowMultiplier},
                               {"fp32_gradients_finite_at_that_multiplier", fp32_finite}};
    return w;
  };
  auto config = [&](const char* fault) {
    return nlohmann::json{{"micro_batch", cfg.micro_batch}, {"accum_steps", K}, {"overflow_micro_batch", 2},
                          {"overflow_fault", fault}};
  };

  // The four checks of GA-5 on the fp16 MLP, each with its controls.
  const double bound = tol::kBitwiseMismatches;
  const char* kSkipTitle = "one overflowing micro-batch skips the whole window, state untouched";
  CheckFamily skip(out, dev, DType::f16, "mlp", "GA-5", kSkipTitle, bound, "violations", tol::kMpScalerReason);
  CheckFamily leak(out, dev, DType::f16, "mlp", "GA-5", "nothing of the skipped window leaks into the next one", bound,
                   "gradient_elements_differing", tol::kMpScalerReason);
  CheckFamily unscale(out, dev, DType::f16, "mlp", "GA-5", kGa5UnscaleTitle, tol::kMpGradRelL2(DType::f16),
                      "rel_l2 of the unscaled gradients against fp32", tol::kMpGradRelL2Reason);
  CheckFamily scale(out, dev, DType::f16, "mlp", "GA-5", kGa5ScaleTitle, bound, "micro_batches_off_scale",
                    tol::kMpScalerReason);
  auto faulted = [&](auto set_fault) {
    StepConfig c = cfg;
    set_fault(c);
    return run(c);
  };

  const Window ok = run(cfg);
  skip.check(ok.skip_violations + (fp32_finite ? 0 : 1), config("none"), ok.details);
  leak.check(ok.leaked, config("none"), ok.details);
  unscale.check(ok.unscale_error, config("none"), ok.details);
  scale.check(ok.scale_violations, config("none"), ok.details);

  const Window dw = faulted([](StepConfig& c) { c.precision.overflow_fault = OverflowFault::skip_micro_batch; });
  skip.gross("dropping the overflowing micro-batch and applying the rest is flagged", dw.skip_violations,
             config("skip_micro_batch"), dw.details);

  const Window kw = faulted([](StepConfig& c) { c.precision.overflow_fault = OverflowFault::keep_last_grad; });
  leak.subtle("one tensor's gradient kept across the skipped window is flagged", kw.leaked, config("keep_last_grad"),
              kw.details);

  // Gross, aimed at the unscale: the gradients also unscaled after every micro-batch.
  const Window tw = faulted([](StepConfig& c) { c.fault_unscale_every_micro_batch = true; });
  unscale.gross("gradients unscaled after every micro-batch as well are flagged", tw.unscale_error,
                config("unscale_every_micro_batch"), tw.details);

  // Subtle, aimed at the unscale: the unscaled gradients kept in fp16, so the
  // small ones lose their low bits (the reason the unscale is done in fp32). At
  // the model's own gradient sizes fp16 holds them nearly as well as fp32 does, so
  // the check also runs with every gradient 2^-12 as large, and the fault there.
  StepConfig small = cfg;
  small.loss_multiplier = tol::kGa5SmallGradientMultiplier;
  auto small_config = [&](const char* fault) {
    nlohmann::json j = config(fault);
    j["loss_multiplier"] = small.loss_multiplier;
    return j;
  };
  const Window smw = run(small);
  unscale.check(smw.unscale_error, small_config("none"), smw.details);
  StepConfig into16 = small;
  into16.fault_unscale_into_fp16 = true;
  const Window hw = run(into16);
  unscale.subtle("gradients unscaled into fp16 are flagged", hw.unscale_error, small_config("unscale_into_fp16"),
                 hw.details);

  // Subtle, aimed at the window's scale: the scaler updated at the overflowing
  // micro-batch, so window 3 runs at a quarter of the scale, not half (4 micro-batches).
  const Window mw = faulted([](StepConfig& c) { c.precision.overflow_fault = OverflowFault::backoff_mid_window; });
  scale.subtle("a scaler updated at the overflowing micro-batch is flagged", mw.scale_violations,
               config("backoff_mid_window"), mw.details);

  // Subtle, aimed at the skip: the window is skipped and its state untouched, but the
  // scale stays where it was (one violation).
  const Window sw = faulted([](StepConfig& c) { c.precision.scaler.fault_no_backoff = true; });
  skip.subtle("a skipped window that keeps its loss scale is flagged", sw.skip_violations, config("no_backoff"),
              sw.details);
  return out;
}

// ---- MP-4 ----
namespace {

struct LostUpdates {
  int64_t window = 0;  // elements whose update lies between 2 fp32 ulps and a quarter fp16 ulp of the weight
  int64_t lost = 0;    // of those, unchanged by the step
  nlohmann::json per_tensor = nlohmann::json::object();
  double fraction() const { return window > 0 ? static_cast<double>(lost) / static_cast<double>(window) : NAN; }
};

// One real SGD step; which updates too small for fp16 survived.
LostUpdates lost_updates(Device& dev, const StepConfig& cfg, const Batch& batch) {
  TrainStep step(dev, cfg);
  const NamedValues p0 = parameter_values(step);
  HR_CHECK(!step.step(batch).skipped, "MP-4: the step overflowed");
  const NamedValues g = gradient_values(step), p1 = parameter_values(step);
  const double lr = cfg.optimizer.sgd.lr;
  LostUpdates r;
  for (size_t t = 0; t < p0.size(); ++t) {
    int64_t w = 0, l = 0;
    for (size_t i = 0; i < p0[t].second.size(); ++i) {
      const double p = p0[t].second[i], upd = std::fabs(lr * static_cast<double>(g[t].second[i]));
      const float p16 = round_to<half_t>(static_cast<float>(p));
      if (p == 0 || p16 == 0.f || std::fabs(p) < 0x1p-14) continue;  // normal fp16 weights only
      const double quarter_ulp16 = std::ldexp(1.0, std::ilogb(p16) - 10) / 4;
      if (!(upd > 0x1p-22 * std::fabs(p) && upd < quarter_ulp16)) continue;
      ++w;
      l += std::memcmp(&p0[t].second[i], &p1[t].second[i], sizeof(float)) == 0 ? 1 : 0;
    }
    r.window += w;
    r.lost += l;
    r.per_tensor[p0[t].first] = nlohmann::json{{"window", w}, {"lost", l}};
  }
  return r;
}

}  // namespace

std::vector<Measurement> mp4_master_weights(Device& dev, Preset preset, uint64_t seed) {
  std::vector<Measurement> out;
  StepConfig cfg = mp_mlp(DType::f16, kEffectiveBatch);
  cfg.optimizer.kind = OptimizerKind::sgd;
  cfg.optimizer.sgd.lr = static_cast<float>(tol::kMpMasterLr);
  const Batch batch = accum_batch(dev, cfg, seed);
  CheckFamily kept_updates(out, dev, DType::f16, "mlp", "MP-4",
                           "updates under a quarter fp16 ulp of the weight are kept by fp32 master weights",
                           tol::kMpLostUpdateFraction, "lost_update_fraction", tol::kMpLostUpdateReason);
  auto config = [&](const char* variant) {
    return nlohmann::json{{"lr", cfg.optimizer.sgd.lr}, {"optimizer", "sgd"}, {"weights", variant}};
  };
  auto details = [](const LostUpdates& r) {
    return nlohmann::json{{"updates_under_quarter_fp16_ulp", r.window}, {"lost", r.lost}, {"per_tensor", r.per_tensor}};
  };
  const LostUpdates kept = lost_updates(dev, cfg, batch);
  kept_updates.check(kept.fraction(), config("fp32 masters"), details(kept));

  StepConfig none = cfg;
  none.precision.master_weights = false;
  const LostUpdates lost = lost_updates(dev, none, batch);
  kept_updates.gross("without fp32 master weights the small updates are lost, and flagged", lost.fraction(),
                     config("fp16 only"), details(lost));

  StepConfig one = cfg;
  one.precision.fault_no_master = tol::kMpNoMasterParam;
  const LostUpdates partial = lost_updates(dev, one, batch);
  kept_updates.subtle(fmt::format("one tensor ({}) without an fp32 master is flagged", tol::kMpNoMasterParam),
                      partial.fraction(), config("fp32 masters but one"), details(partial));
  return out;
}

// ---- MP-5 ----
namespace {

// Peak activation bytes of one step (the tracker's Consumer::activations).
size_t activation_peak(Device& dev, const StepConfig& cfg, const Batch& batch) {
  TrainStep step(dev, cfg);
  dev.memory().reset_peak();
  const size_t base = dev.memory().snapshot().current(Consumer::activations);
  step.step(batch);
  return dev.memory().snapshot().peak(Consumer::activations) - base;
}

}  // namespace

std::vector<Measurement> mp5_activation_bytes(Device& dev, Preset preset, uint64_t seed) {
  std::vector<Measurement> out;
  auto half_of_fp32 = [&](DType d, const char* model) {
    return CheckFamily(out, dev, d, model, "MP-5", "activation bytes in 16 bits are half of fp32's",
                       tol::kMpActivationRatioRel, "abs(ratio / 0.5 - 1)", tol::kMpActivationRatioReason);
  };
  auto off_half = [](double ratio) { return std::fabs(ratio / 0.5 - 1.0); };
  for (const char* model : {"mlp", "transformer"}) {
    const bool mlp = std::string(model) == "mlp";
    auto config = [&](DType d) {
      StepConfig c = mlp ? accum_mlp_config(d, kEffectiveBatch, preset) : accum_transformer_config(d, kEffectiveBatch, preset);
      return c;
    };
    const StepConfig c32 = config(DType::f32);
    const Batch batch = accum_batch(dev, c32, seed);
    const double a32 = static_cast<double>(activation_peak(dev, c32, batch));
    for (DType d : {DType::f16, DType::bf16}) {
      const double a16 = static_cast<double>(activation_peak(dev, config(d), batch));
      const double ratio = a16 / a32;
      half_of_fp32(d, model).check(off_half(ratio), nlohmann::json::object(),
                                   {{"activation_bytes_fp32", a32}, {"activation_bytes_16bit", a16}, {"ratio", ratio}});
    }
    if (mlp) continue;
    // Controls (transformer, fp16): activations kept in fp32 (the step's autocast
    // fault: the ratio is 1), and one kept tensor per block counted elsewhere.
    CheckFamily controls = half_of_fp32(DType::f16, model);
    StepConfig f32_acts = config(DType::f16);
    f32_acts.precision.fault_fp32_activations = true;
    const double fp32_ratio = static_cast<double>(activation_peak(dev, f32_acts, batch)) / a32;
    controls.gross("a 16-bit run that keeps its activations in fp32 is flagged", off_half(fp32_ratio),
                   {{"fault_fp32_activations", true}}, {{"ratio", fp32_ratio}});
    StepConfig c16 = config(DType::f16);
    c16.kept_label_fault = KeptLabelFault::block_hidden;
    const double ratio = static_cast<double>(activation_peak(dev, c16, batch)) / a32;
    controls.subtle("a 16-bit run whose MLP hidden activations are counted as workspace is flagged", off_half(ratio),
                    {{"kept_label_fault", "block_hidden"}}, {{"ratio", ratio}});
  }
  return out;
}

}  // namespace hr::props

HR_REGISTER_PROPERTY(hr::PropertySpec{"MP-1", "fp16 underflow of small gradients, and the loss scale that prevents it",
                                      0.3, [](hr::RunContext& c) {
                                        return hr::props::mp1_fp16_underflow(c.device, c.preset, c.seed);
                                      }, ""});
HR_REGISTER_PROPERTY(hr::PropertySpec{"MP-2", "bf16 keeps the same small gradients without a loss scale", 0.2,
                                      [](hr::RunContext& c) {
                                        return hr::props::mp2_bf16_range(c.device, c.preset, c.seed);
                                      }, ""});
HR_REGISTER_PROPERTY(hr::PropertySpec{"MP-3", "the dynamic loss scaler: skip, back off, grow", 0.5,
                                      [](hr::RunContext& c) {
                                        return hr::props::mp3_loss_scaler(c.device, c.preset, c.seed);
                                      }, ""});
HR_REGISTER_PROPERTY(hr::PropertySpec{"GA-5", "an overflowing micro-batch skips its whole window", 0.2,
                                      [](hr::RunContext& c) {
                                        return hr::props::ga5_overflow_in_window(c.device, c.preset, c.seed);
                                      }, ""});
HR_REGISTER_PROPERTY(hr::PropertySpec{"MP-4", "fp32 master weights keep updates under an fp16 ulp", 0.1,
                                      [](hr::RunContext& c) {
                                        return hr::props::mp4_master_weights(c.device, c.preset, c.seed);
                                      }, ""});
HR_REGISTER_PROPERTY(hr::PropertySpec{"MP-5", "16-bit activations take half the bytes of fp32", 0.3,
                                      [](hr::RunContext& c) {
                                        return hr::props::mp5_activation_bytes(c.device, c.preset, c.seed);
                                      }, ""});
