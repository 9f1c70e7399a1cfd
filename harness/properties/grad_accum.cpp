// GA-1..GA-4: gradient accumulation checked against the full batch on both
// controlled models. Every comparison is between two TrainSteps built from the
// same seed that differ only in micro_batch (and the loss normalisation under
// test); dropout is off (see accum_support.hpp). Anchors: PROPERTIES.md GA; GA-4
// follows the 2024 accumulation fix in Hugging Face transformers
// (num_items_in_batch: divide the summed loss by the real tokens of the window).
#include "harness/properties/grad_accum.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <functional>

#include "harness/check.hpp"
#include "harness/data/synthetic.hpp"
#include "harness/properties/accum_support.hpp"
#include "harness/tolerances.hpp"

namespace hr::props {
namespace {

using ConfigFn = std::function<StepConfig(DType, int64_t, Preset)>;

struct ModelCase {
  const char* name;
  ConfigFn config;
};

std::vector<ModelCase> model_cases() {
  return {{"mlp", [](DType d, int64_t mb, Preset p) { return accum_mlp_config(d, mb, p); }},
          {"transformer", [](DType d, int64_t mb, Preset p) { return accum_transformer_config(d, mb, p); }}};
}

struct GradRun {
  NamedValues grads;
  double loss = 0;
};

GradRun gradients_of(Device& dev, const StepConfig& cfg, const Batch& batch) {
  TrainStep step(dev, cfg);
  GradRun r;
  r.loss = step.forward_backward(batch);
  HR_CHECK(!step.gradients_nonfinite(), "{} {}: non-finite gradients at micro_batch {}", model_kind_name(cfg.model),
           dtype_name(cfg.precision.compute), cfg.micro_batch);
  r.grads = gradient_values(step);
  return r;
}

nlohmann::json accum_config(int64_t micro_batch, const char* loss_norm) {
  return nlohmann::json{{"effective_batch", kEffectiveBatch},
                        {"micro_batch", micro_batch},
                        {"accum_steps", kEffectiveBatch / micro_batch},
                        {"loss_normalization", loss_norm},
                        {"dropout", 0.0}};
}

nlohmann::json compare_details(const TensorsCompare& c) {
  return nlohmann::json{{"worst_tensor", c.worst},
                        {"global_rel_l2", json_number(c.global_rel_l2)},
                        {"norm_accumulated", c.got_norm},
                        {"norm_full_batch", c.ref_norm},
                        {"per_tensor_rel_l2", c.per_tensor}};
}

constexpr const char* kDropoutNote =
    "dropout p = 0: each micro-batch draws its masks from its own Philox offset range, so with p > 0 "
    "the masks would differ from the full batch's by construction";

}  // namespace

std::vector<Measurement> ga1_accumulated_gradient(Device& dev, DType dtype, Preset preset, uint64_t seed) {
  std::vector<Measurement> out;
  const double tol = tol::kGradAccumRelL2(dtype);
  for (const ModelCase& mc : model_cases()) {
    const StepConfig full_cfg = mc.config(dtype, kEffectiveBatch, preset);
    const Batch batch = accum_batch(dev, full_cfg, seed);
    const GradRun full = gradients_of(dev, full_cfg, batch);
    for (int64_t mb : accum_micro_batches()) {
      const GradRun acc = gradients_of(dev, mc.config(dtype, mb, preset), batch);
      const TensorsCompare c = compare_tensors(acc.grads, full.grads, exact_zero_gradients(full_cfg));
      Measurement m = make_check("GA-1", "accumulated gradient equals the full-batch gradient", c.max_rel_l2, tol);
      describe(m, dev, dtype, mc.name);
      m.config = accum_config(mb, "mean_div_k");
      m.metric = "max_tensor_rel_l2";
      m.tolerance_reason = tol::kGradAccumReason;
      m.details = compare_details(c);
      m.details["loss_accumulated"] = acc.loss;
      m.details["loss_full_batch"] = full.loss;
      m.details["dropout"] = kDropoutNote;
      out.push_back(std::move(m));
    }
  }
  return out;
}

std::vector<Measurement> ga2_no_division(Device& dev, DType dtype, Preset preset, uint64_t seed) {
  std::vector<Measurement> out;
  const double tol = tol::kGradAccumRelL2(dtype);
  for (const ModelCase& mc : model_cases()) {
    const StepConfig full_cfg = mc.config(dtype, kEffectiveBatch, preset);
    const Batch batch = accum_batch(dev, full_cfg, seed);
    const GradRun full = gradients_of(dev, full_cfg, batch);
    for (int64_t mb : accum_micro_batches()) {
      if (mb == kEffectiveBatch) continue;  // K = 1: dividing by K changes nothing
      const int64_t K = kEffectiveBatch / mb;
      StepConfig cfg = mc.config(dtype, mb, preset);
      cfg.loss_norm = LossNormalization::no_division;
      const GradRun broken = gradients_of(dev, cfg, batch);
      const TensorsCompare c = compare_tensors(broken.grads, full.grads, exact_zero_gradients(full_cfg));
      const double ratio = c.got_norm / c.ref_norm;

      // The broken variant, judged by GA-1's own check: must be flagged.
      Measurement caught = make_negative_control(
          "GA-2", "without the division by K, GA-1's check flags the accumulated gradient", c.max_rel_l2, tol);
      describe(caught, dev, dtype, mc.name);
      caught.config = accum_config(mb, "no_division");
      caught.metric = "max_tensor_rel_l2";
      caught.tolerance_reason = tol::kGradAccumReason;
      caught.details = compare_details(c);
      caught.details["norm_ratio"] = ratio;
      caught.details["expected_error"] = static_cast<double>(K - 1);
      out.push_back(std::move(caught));

      // And the size of the damage: the gradient is exactly K times too large
      // (the effective learning rate is multiplied by K).
      Measurement r = make_check("GA-2",
                                 "without the division by K, the accumulated gradient is K times the full-batch one",
                                 std::fabs(ratio / static_cast<double>(K) - 1.0), tol);
      describe(r, dev, dtype, mc.name);
      r.config = accum_config(mb, "no_division");
      r.metric = "abs(norm_ratio / K - 1)";
      r.tolerance_reason = tol::kGradAccumReason;
      r.details = nlohmann::json{{"norm_ratio", ratio}, {"K", K}, {"loss_no_division", broken.loss},
                                 {"loss_full_batch", full.loss}};
      out.push_back(std::move(r));
    }
  }
  return out;
}

std::vector<Measurement> ga3_optimizer_step(Device& dev, DType dtype, Preset preset, uint64_t seed) {
  std::vector<Measurement> out;
  const double tol = tol::kGradAccumRelL2(dtype);
  // SGD's lr is large enough that a step moves the parameters visibly (||delta|| /
  // ||param|| ~1e-2), so GA-2's error would show at this level; AdamW at its defaults.
  OptimizerConfig sgd;
  sgd.kind = OptimizerKind::sgd;
  sgd.sgd.lr = 0.1f;
  OptimizerConfig adamw;
  adamw.kind = OptimizerKind::adamw;
  const std::pair<const char*, OptimizerConfig> optimizers[] = {{"sgd", sgd}, {"adamw", adamw}};
  const int64_t micro_batches[] = {1, 4};

  for (const ModelCase& mc : model_cases()) {
    for (const auto& named_opt : optimizers) {
      const char* opt_name = named_opt.first;
      const OptimizerConfig& opt = named_opt.second;
      auto params_after_step = [&](int64_t mb, LossNormalization norm, const Batch& batch, NamedValues* before) {
        StepConfig cfg = mc.config(dtype, mb, preset);
        cfg.optimizer = opt;
        cfg.loss_norm = norm;
        TrainStep step(dev, cfg);
        if (before) *before = parameter_values(step);
        const StepResult r = step.step(batch);
        HR_CHECK(!r.skipped, "GA-3 {} {}: the step was skipped (non-finite gradients)", mc.name, dtype_name(dtype));
        return parameter_values(step);
      };
      const StepConfig full_cfg = mc.config(dtype, kEffectiveBatch, preset);
      const Batch batch = accum_batch(dev, full_cfg, seed);
      NamedValues initial;
      const NamedValues full = params_after_step(kEffectiveBatch, LossNormalization::mean_div_k, batch, &initial);
      // How far one step moves the parameters.
      const TensorsCompare moved = compare_tensors(full, initial, exact_zero_gradients(full_cfg));

      // The same step without the division by K. SGD moves K times too far and
      // the check must catch it. Adam divides its update by sqrt(v), so a gradient
      // K times too large changes its first step only through eps: reported beside
      // the AdamW checks, not asserted.
      const int64_t broken_mb = 4;
      const NamedValues broken = params_after_step(broken_mb, LossNormalization::no_division, batch, nullptr);
      const TensorsCompare bc = compare_tensors(broken, full, exact_zero_gradients(full_cfg));

      for (int64_t mb : micro_batches) {
        const NamedValues acc = params_after_step(mb, LossNormalization::mean_div_k, batch, nullptr);
        const TensorsCompare c = compare_tensors(acc, full, exact_zero_gradients(full_cfg));
        const bool adam = opt.kind == OptimizerKind::adamw;
        Measurement m = make_check("GA-3",
                                   fmt::format("one {} step from the accumulated gradient gives the large-batch "
                                               "step's parameters",
                                               opt_name),
                                   c.max_rel_l2, adam ? tol::kGradAccumAdamStepRelL2(dtype) : tol);
        describe(m, dev, dtype, mc.name);
        m.config = accum_config(mb, "mean_div_k");
        m.config["optimizer"] = opt_name;
        m.metric = "max_tensor_rel_l2";
        m.tolerance_reason = adam ? tol::kGradAccumAdamStepReason : tol::kGradAccumReason;
        m.details = nlohmann::json{{"worst_tensor", c.worst},
                                   {"global_rel_l2", json_number(c.global_rel_l2)},
                                   {"step_size_rel_l2", json_number(moved.global_rel_l2)},
                                   {"per_tensor_rel_l2", c.per_tensor}};
        if (opt.kind == OptimizerKind::adamw)
          m.details["no_division_max_tensor_rel_l2"] =
              nlohmann::json{{"micro_batch", broken_mb}, {"value", json_number(bc.max_rel_l2)},
                             {"note", "Adam divides by sqrt(v): K times the gradient changes step 1 only via eps"}};
        out.push_back(std::move(m));
      }
      if (opt.kind == OptimizerKind::sgd) {
        Measurement m = make_negative_control(
            "GA-3", "one SGD step without the division by K moves the parameters K times too far", bc.max_rel_l2, tol);
        describe(m, dev, dtype, mc.name);
        m.config = accum_config(broken_mb, "no_division");
        m.config["optimizer"] = opt_name;
        m.metric = "max_tensor_rel_l2";
        m.tolerance_reason = tol::kGradAccumReason;
        m.details = nlohmann::json{{"worst_tensor", bc.worst},
                                   {"global_rel_l2", json_number(bc.global_rel_l2)},
                                   {"step_size_rel_l2", json_number(moved.global_rel_l2)},
                                   {"K", kEffectiveBatch / broken_mb}};
        out.push_back(std::move(m));
      }
    }
  }
  return out;
}

std::vector<Measurement> ga4_variable_length(Device& dev, DType dtype, Preset preset, uint64_t seed) {
  std::vector<Measurement> out;
  const double tol = tol::kGradAccumRelL2(dtype);
  const StepConfig full_cfg = accum_transformer_config(dtype, kEffectiveBatch, preset);
  const char* anchor = "Hugging Face transformers 2024 accumulation fix (num_items_in_batch)";
  // A long-tailed length distribution over the row length (the field guide's
  // shape, scaled): most rows are short, a few are full.
  LengthDistribution dist;
  dist.max = full_cfg.seq_len;
  dist.p95 = full_cfg.seq_len * 3 / 4;
  dist.min = 2;
  // Two orders of the same rows:
  // - shuffled (as sampled): the correct normalisation is checked at every K, and
  //   the per-micro-batch-mean error measured against K (it grows: a micro-batch of
  //   fewer rows holds a less typical token count). With shuffled rows the halves
  //   at K = 2 can hold nearly equal counts, and then the broken form is nearly right;
  // - sorted by length (as a length-grouped sampler delivers them): consecutive
  //   micro-batches hold very different token counts at every K, so there the
  //   broken form must be flagged by GA-1's check at every K.
  const std::vector<int64_t> shuffled = sample_lengths(dist, kEffectiveBatch, seed + 1);
  std::vector<int64_t> sorted = shuffled;
  std::sort(sorted.begin(), sorted.end());
  const Batch batch = accum_batch(dev, full_cfg, seed, shuffled);
  const Batch sorted_batch = accum_batch(dev, full_cfg, seed, sorted);
  const GradRun full = gradients_of(dev, full_cfg, batch);
  const GradRun sorted_full = gradients_of(dev, full_cfg, sorted_batch);
  const ZeroGradientRule zero = exact_zero_gradients(full_cfg);

  auto run = [&](int64_t mb, LossNormalization norm, const Batch& b, const GradRun& ref, TensorsCompare* c) {
    StepConfig cfg = accum_transformer_config(dtype, mb, preset);
    cfg.loss_norm = norm;
    const GradRun acc = gradients_of(dev, cfg, b);
    *c = compare_tensors(acc.grads, ref.grads, zero);
    return std::fabs(acc.loss - ref.loss) / std::fabs(ref.loss);
  };
  auto fill = [&](Measurement& m, int64_t mb, LossNormalization norm, const TensorsCompare& c, double loss_rel,
                  const char* rows) {
    describe(m, dev, dtype, "transformer");
    m.config = accum_config(mb, loss_normalization_name(norm));
    m.config["rows"] = rows;
    m.metric = "max_tensor_rel_l2";
    m.tolerance_reason = tol::kGradAccumReason;
    m.details = compare_details(c);
    m.details["loss_rel_error"] = loss_rel;
    m.details["anchor"] = anchor;
  };

  nlohmann::json series = nlohmann::json::array();
  std::vector<double> ks, errs;  // ascending K
  std::vector<int64_t> mbs = accum_micro_batches();
  std::sort(mbs.rbegin(), mbs.rend());
  for (int64_t mb : mbs) {
    if (mb == kEffectiveBatch) continue;  // K = 1: nothing to normalise across
    const int64_t K = kEffectiveBatch / mb;
    TensorsCompare c;

    double loss_rel = run(mb, LossNormalization::sum_div_window_items, batch, full, &c);
    Measurement ok = make_check(
        "GA-4", "padded rows: the summed loss over the real tokens of the whole window equals the full batch",
        c.max_rel_l2, tol);
    fill(ok, mb, LossNormalization::sum_div_window_items, c, loss_rel, "shuffled");
    out.push_back(std::move(ok));

    loss_rel = run(mb, LossNormalization::mean_div_k, batch, full, &c);
    series.push_back({{"accum_steps", K}, {"micro_batch", mb}, {"max_tensor_rel_l2", json_number(c.max_rel_l2)},
                      {"global_rel_l2", json_number(c.global_rel_l2)}, {"loss_rel_error", loss_rel}});
    ks.push_back(static_cast<double>(K));
    errs.push_back(c.global_rel_l2);

    loss_rel = run(mb, LossNormalization::mean_div_k, sorted_batch, sorted_full, &c);
    Measurement bad = make_negative_control(
        "GA-4", "padded rows: per-micro-batch token means divided by K are flagged by GA-1's check", c.max_rel_l2, tol);
    fill(bad, mb, LossNormalization::mean_div_k, c, loss_rel, "sorted_by_length");
    out.push_back(std::move(bad));
  }

  // The error grows with K: the largest K's error over the smallest's (> 1 when
  // it grows), with the least-squares slope of log error against log K reported.
  bool monotone = true;
  for (size_t i = 1; i < errs.size(); ++i) monotone = monotone && errs[i] > errs[i - 1];
  double sx = 0, sy = 0, sxx = 0, sxy = 0;
  const double n = static_cast<double>(errs.size());
  for (size_t i = 0; i < errs.size(); ++i) {
    const double x = std::log(ks[i]), y = std::log(errs[i]);
    sx += x, sy += y, sxx += x * x, sxy += x * y;
  }
  const double slope = (n * sxy - sx * sy) / (n * sxx - sx * sx);
  Measurement g = make_negative_control("GA-4", "padded rows: the per-micro-batch-mean error grows with K",
                                        errs.back() / errs.front(), 1.0);
  describe(g, dev, dtype, "transformer");
  g.config = nlohmann::json{{"effective_batch", kEffectiveBatch}, {"loss_normalization", "mean_div_k"},
                            {"rows", "shuffled"}, {"accum_steps", nlohmann::json(ks)}};
  g.metric = "global_rel_l2(K max) / global_rel_l2(K min)";
  g.tolerance_reason = "grows: the ratio must exceed 1";
  g.details = nlohmann::json{{"series", series},
                             {"loglog_slope", json_number(slope)},
                             {"strictly_increasing", monotone},
                             {"row_lengths", shuffled},
                             {"anchor", anchor}};
  out.push_back(std::move(g));
  return out;
}

namespace {

HR_REGISTER_PROPERTY(PropertySpec{"GA-1", "accumulated gradient equals the full-batch gradient", 1.0,
                                  [](RunContext& c) { return every_float_dtype(c, ga1_accumulated_gradient); }});
HR_REGISTER_PROPERTY(PropertySpec{"GA-2", "without the division by K the gradient is K times too large, and caught",
                                  1.0, [](RunContext& c) { return every_float_dtype(c, ga2_no_division); }});
HR_REGISTER_PROPERTY(PropertySpec{"GA-3", "one optimizer step from accumulated gradients equals the large-batch step",
                                  1.0, [](RunContext& c) { return every_float_dtype(c, ga3_optimizer_step); }});
HR_REGISTER_PROPERTY(PropertySpec{"GA-4", "padded rows: window token count normalises, per-micro-batch means do not",
                                  1.5, [](RunContext& c) { return every_float_dtype(c, ga4_variable_length); }});

}  // namespace
}  // namespace hr::props
