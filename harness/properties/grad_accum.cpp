// GA-1..GA-4: gradient accumulation checked against the full batch on both
// controlled models. Every comparison is between two TrainSteps built from the
// same seed that differ only in micro_batch (and the loss normalisation under
// test); dropout is off (see accum_support.hpp; GA-6 turns it on). Anchors: docs/catalogue.md GA; GA-4
// follows the 2024 accumulation fix in Hugging Face transformers
// (num_items_in_batch: divide the summed loss by the real tokens of the window).
//
// Each property runs its gross negative control (the documented failure at full
// size) and a subtle one whose error lies within 10-100x of the bound (a 16-bit
// gradient buffer, a count off by one), caught by the same check: the measure of
// what the check can see (docs/catalogue.md POWER).
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
constexpr const char* kGa1Title = "accumulated gradient equals the full-batch gradient";
constexpr const char* kGa1BufferTitle =
    "the accumulation buffer adds the micro-batches' gradients as exactly as fp32 does";
constexpr const char* kGa2TimesKTitle = "without the division by K, the accumulated gradient is K times the full-batch one";
constexpr const char* kGa3SgdTitle = "one SGD step from the accumulated gradient makes the large-batch update";
constexpr const char* kGa3MomentsTitle = "AdamW moments after a step from the accumulated gradient equal the large-batch step's";
constexpr const char* kGa3AdamTitle = "two AdamW steps from accumulated gradients make the large-batch updates";
constexpr const char* kGa4Title = "padded rows: the summed loss over the real tokens of the whole window equals the full batch";
}  // namespace
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

// The micro-batches GA-1 compares with the full batch: K = 1 would compare the
// reference with itself, so it is not an accumulation check and is left out.
std::vector<int64_t> accumulating_micro_batches() {
  std::vector<int64_t> out;
  for (int64_t mb : accum_micro_batches())
    if (mb < kEffectiveBatch) out.push_back(mb);
  return out;
}

struct GradRun {
  NamedValues grads;
  double loss = 0;
  bool nonfinite = false;  // an inf or NaN reached a gradient: the comparison reads NaN
};

// One accumulated forward + backward. A non-finite gradient is not thrown: it makes
// the comparison NaN, which fails the check and is recorded with the others.
GradRun gradients_of(Device& dev, const StepConfig& cfg, const Batch& batch) {
  TrainStep step(dev, cfg);
  GradRun r;
  r.loss = step.forward_backward(batch);
  r.nonfinite = step.gradients_nonfinite();
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
    "dropout p = 0, so that the comparison isolates accumulation; with dropout on, masks keyed by sample give the "
    "full batch's masks, and GA-6 checks that";

// GA-1's subtle control: gradients accumulated in a 16-bit buffer, the fault fp32
// accumulation exists to avoid. fp32 compute takes an fp16 buffer, fp16 compute a
// bf16 one, bf16 compute its own (tol::kGradAccumSubtleBuffer says why and at which K).
// Every value divided by k (a power of two: exact).
NamedValues divided_by(NamedValues v, int64_t k) {
  const float inv = 1.f / static_cast<float>(k);
  for (auto& [name, x] : v)
    for (float& e : x) e *= inv;
  return v;
}

DType subtle_buffer_dtype(DType compute) { return compute == DType::f32 ? DType::f16 : DType::bf16; }

StepConfig with_buffer(StepConfig c, DType buffer) {
  c.precision.grad_accum = buffer;
  return c;
}

}  // namespace

std::vector<Measurement> ga1_accumulated_gradient(Device& dev, DType dtype, Preset preset, uint64_t seed) {
  std::vector<Measurement> out;
  const double tol = tol::kGradAccumRelL2(dtype);
  for (const ModelCase& mc : model_cases()) {
    const StepConfig full_cfg = mc.config(dtype, kEffectiveBatch, preset);
    const Batch batch = accum_batch(dev, full_cfg, seed);
    const GradRun full = gradients_of(dev, full_cfg, batch);
    const ZeroGradientRule zero = exact_zero_gradients(full_cfg);
    for (int64_t mb : accumulating_micro_batches()) {
      const GradRun acc = gradients_of(dev, mc.config(dtype, mb, preset), batch);
      const TensorsCompare c = compare_tensors(acc.grads, full.grads, zero);
      Measurement m = make_check("GA-1", kGa1Title, c.max_rel_l2, tol);
      describe(m, dev, dtype, mc.name);
      m.config = accum_config(mb, "mean_div_k");
      m.metric = "max_tensor_rel_l2";
      m.tolerance_reason = tol::kGradAccumReason;
      m.details = compare_details(c);
      m.details["loss_accumulated"] = acc.loss;
      m.details["loss_full_batch"] = full.loss;
      m.details["nonfinite"] = acc.nonfinite || full.nonfinite;
      m.details["dropout"] = kDropoutNote;
      out.push_back(std::move(m));
    }

    // The buffer alone: the accumulated gradient against the exact (float64) sum of
    // its micro-batches' gradients, each computed by the same step on that micro-batch
    // alone, with the loss divided as the window divides it (the multiplier 1 / K
    // makes the step's divisor K times the micro-batch's items). Each micro-batch's
    // backward then runs at the magnitudes it has inside the window, so the 16-bit
    // compute's own rounding, fp16's underflow below 2^-14 included, is the same on
    // both sides; what is left is the buffer's: fp32 rounding for a right one, 16-bit
    // rounding of every addition for the fault. (A micro-batch alone at K times those
    // magnitudes keeps gradients that fp16 loses inside the window: 4.4e-4 at the
    // full preset's transformer, 9x the bound, for every K.)
    for (int64_t K : tol::kGradAccumBufferKs) {
      const int64_t mb = kEffectiveBatch / K;
      NamedValues sum;  // float64 sum, stored as float
      std::vector<std::vector<double>> acc64;
      for (int64_t k = 0; k < K; ++k) {
        StepConfig one = mc.config(dtype, mb, preset);
        one.batch = mb;
        one.loss_multiplier = 1.0 / static_cast<double>(K);
        const GradRun g = gradients_of(dev, one, batch.slice(k * mb, (k + 1) * mb));
        if (acc64.empty()) {
          sum = g.grads;
          acc64.resize(g.grads.size());
          for (size_t t = 0; t < g.grads.size(); ++t) acc64[t].assign(g.grads[t].second.size(), 0.0);
        }
        for (size_t t = 0; t < g.grads.size(); ++t)
          for (size_t i = 0; i < g.grads[t].second.size(); ++i) acc64[t][i] += g.grads[t].second[i];
      }
      for (size_t t = 0; t < sum.size(); ++t)
        for (size_t i = 0; i < sum[t].second.size(); ++i)
          sum[t].second[i] = static_cast<float>(acc64[t][i]);
      const std::string buffer_check = check_name("GA-1", kGa1BufferTitle);
      auto measure = [&](DType buf, const char* control) {
        const GradRun acc = gradients_of(dev, with_buffer(mc.config(dtype, mb, preset), buf), batch);
        const TensorsCompare c = compare_tensors(acc.grads, sum, zero);
        const double btol = tol::kGradAccumBufferRelL2;
        const std::string k = control;
        Measurement m =
            k.empty() ? make_check("GA-1", kGa1BufferTitle, c.max_rel_l2, btol)
                      : make_subtle_control("GA-1",
                                            fmt::format("an {} accumulation buffer is flagged by the buffer check",
                                                        dtype_name(buf)),
                                            c.max_rel_l2, btol, buffer_check);
        describe(m, dev, dtype, mc.name);
        m.config = accum_config(mb, "mean_div_k");
        if (buf != DType::f32) m.config["grad_accum"] = dtype_name(buf);
        m.metric = "max_tensor_rel_l2 against the float64 sum of the micro-batches' gradients";
        m.tolerance_reason = tol::kGradAccumBufferReason;
        m.details = compare_details(c);
        if (buf != DType::f32) m.details["fault"] = tol::kGradAccumSubtleBufferReason;
        out.push_back(std::move(m));
      };
      measure(DType::f32, "");
      measure(DType::f16, "subtle");
    }

    // Subtle: the same accumulation into a 16-bit buffer.
    const DType buffer = subtle_buffer_dtype(dtype);
    const int64_t mb = tol::kGradAccumSubtleBufferMicroBatch(dtype);
    const GradRun narrow = gradients_of(dev, with_buffer(mc.config(dtype, mb, preset), buffer), batch);
    const TensorsCompare c = compare_tensors(narrow.grads, full.grads, zero);
    Measurement s = make_subtle_control(
        "GA-1", fmt::format("gradients accumulated in a {} buffer are flagged", dtype_name(buffer)), c.max_rel_l2, tol, check_name("GA-1", kGa1Title));
    describe(s, dev, dtype, mc.name);
    s.config = accum_config(mb, "mean_div_k");
    s.config["grad_accum"] = dtype_name(buffer);
    s.metric = "max_tensor_rel_l2";
    s.tolerance_reason = tol::kGradAccumReason;
    s.details = compare_details(c);
    s.details["fault"] = tol::kGradAccumSubtleBufferReason;
    out.push_back(std::move(s));
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
    const ZeroGradientRule zero = exact_zero_gradients(full_cfg);
    for (int64_t mb : accumulating_micro_batches()) {
      const int64_t K = kEffectiveBatch / mb;
      StepConfig cfg = mc.config(dtype, mb, preset);
      cfg.loss_norm = LossNormalization::no_division;
      const GradRun broken = gradients_of(dev, cfg, batch);
      const TensorsCompare c = compare_tensors(broken.grads, full.grads, zero);
      const double ratio = c.got_norm / c.ref_norm;

      // The broken variant, judged by GA-1's own check: must be flagged.
      Measurement caught = make_negative_control(
          "GA-2", "without the division by K, GA-1's check flags the accumulated gradient", c.max_rel_l2, tol, check_name("GA-1", kGa1Title));
      describe(caught, dev, dtype, mc.name);
      caught.config = accum_config(mb, "no_division");
      caught.metric = "max_tensor_rel_l2";
      caught.tolerance_reason = tol::kGradAccumReason;
      caught.details = compare_details(c);
      caught.details["norm_ratio"] = ratio;
      caught.details["expected_error"] = static_cast<double>(K - 1);
      out.push_back(std::move(caught));

      // And the size of the damage: the gradient is K times too large (the
      // effective learning rate is multiplied by K), tensor by tensor: divided by K
      // (a power of two, exact) it is the full-batch gradient within GA-1's bound.
      const TensorsCompare d = compare_tensors(divided_by(broken.grads, K), full.grads, zero);
      Measurement r = make_check("GA-2", kGa2TimesKTitle, d.max_rel_l2, tol);
      describe(r, dev, dtype, mc.name);
      r.config = accum_config(mb, "no_division");
      r.metric = "max_tensor_rel_l2 of gradient / K";
      r.tolerance_reason = tol::kGradAccumReason;
      r.details = compare_details(d);
      r.details["norm_ratio"] = ratio;
      r.details["K"] = K;
      r.details["loss_no_division"] = broken.loss;
      r.details["loss_full_batch"] = full.loss;
      out.push_back(std::move(r));
    }
    {  // Its subtle control: the undivided gradient accumulated in a 16-bit buffer.
      const DType buffer = subtle_buffer_dtype(dtype);
      const int64_t mb = tol::kGradAccumSubtleBufferMicroBatch(dtype);
      const int64_t K = kEffectiveBatch / mb;
      StepConfig cfg = with_buffer(mc.config(dtype, mb, preset), buffer);
      cfg.loss_norm = LossNormalization::no_division;
      const GradRun broken = gradients_of(dev, cfg, batch);
      const TensorsCompare d = compare_tensors(divided_by(broken.grads, K), full.grads, zero);
      Measurement s = make_subtle_control(
          "GA-2", fmt::format("without the division by K, in a {} buffer, K times the full-batch gradient is flagged",
                              dtype_name(buffer)),
          d.max_rel_l2, tol, check_name("GA-2", kGa2TimesKTitle));
      describe(s, dev, dtype, mc.name);
      s.config = accum_config(mb, "no_division");
      s.config["grad_accum"] = dtype_name(buffer);
      s.metric = "max_tensor_rel_l2 of gradient / K";
      s.tolerance_reason = tol::kGradAccumReason;
      s.details = compare_details(d);
      out.push_back(std::move(s));
    }

    // Subtle: an off-by-one in the accumulation count, dividing by K + 1. Its error
    // is 1 / (K + 1), which lies within 100x of the bound only where the bound is
    // 16-bit; in fp32 the off-by-one is ~3000x the bound and the subtle fault is
    // the 16-bit buffer, counted once more (tol::kGradAccumSubtleCountK says why).
    const int64_t K = tol::kGradAccumSubtleCountK(dtype);
    const int64_t mb = dtype == DType::f32 ? tol::kGradAccumSubtleBufferMicroBatch(dtype) : kEffectiveBatch / K;
    StepConfig cfg = mc.config(dtype, mb, preset);
    const char* fault;
    if (dtype == DType::f32) {
      cfg = with_buffer(cfg, subtle_buffer_dtype(dtype));
      fault = "gradients accumulated in an fp16 buffer are flagged (fp32: 1 / (K + 1) is far from the bound)";
    } else {
      cfg.loss_norm = LossNormalization::mean_div_k_plus_one;
      fault = "dividing by K + 1 instead of K is flagged";
    }
    const GradRun broken = gradients_of(dev, cfg, batch);
    const TensorsCompare c = compare_tensors(broken.grads, full.grads, zero);
    Measurement s = make_subtle_control("GA-2", fault, c.max_rel_l2, tol, check_name("GA-1", kGa1Title));
    describe(s, dev, dtype, mc.name);
    s.config = accum_config(mb, loss_normalization_name(cfg.loss_norm));
    if (cfg.precision.grad_accum != DType::f32) s.config["grad_accum"] = dtype_name(cfg.precision.grad_accum);
    s.metric = "max_tensor_rel_l2";
    s.tolerance_reason = tol::kGradAccumReason;
    s.details = compare_details(c);
    s.details["expected_error"] = dtype == DType::f32 ? nlohmann::json("see GA-1's buffer control")
                                                      : nlohmann::json(1.0 / static_cast<double>(K + 1));
    out.push_back(std::move(s));
  }
  return out;
}

namespace {

// Per-tensor comparison of two optimizer updates from the same starting point:
// ||(got - p0) - (ref - p0)|| / ||ref - p0||, in double from the fp32 values. The
// parameters are fp32, so each update carries the rounding of p0 + delta: up to one
// fp32 ulp per element, 2^-23 ||p0|| per tensor, which is the resolution of the
// comparison (`rounding_floor`, relative to the update).
struct UpdateCompare {
  TensorsCompare c;
  double rounding_floor = 0;   // max over tensors of 2^-23 ||p0|| / ||ref - p0||
  double min_update_rel = INFINITY;  // min over tensors with p0 != 0 of ||ref - p0|| / ||p0||
};

UpdateCompare compare_updates(const NamedValues& got, const NamedValues& ref, const NamedValues& p0,
                              const ZeroGradientRule& zero) {
  NamedValues dg = got, dr = ref;
  UpdateCompare u;
  for (size_t t = 0; t < p0.size(); ++t) {
    double p2 = 0, d2 = 0;
    for (size_t i = 0; i < p0[t].second.size(); ++i) {
      dg[t].second[i] = static_cast<float>(static_cast<double>(got[t].second[i]) - p0[t].second[i]);
      dr[t].second[i] = static_cast<float>(static_cast<double>(ref[t].second[i]) - p0[t].second[i]);
      p2 += static_cast<double>(p0[t].second[i]) * p0[t].second[i];
      d2 += static_cast<double>(dr[t].second[i]) * dr[t].second[i];
    }
    if (zero && zero(p0[t].first)) continue;  // noise against noise (accum_support.hpp)
    if (d2 > 0) u.rounding_floor = std::max(u.rounding_floor, std::ldexp(std::sqrt(p2 / d2), -23));
    if (p2 > 0) u.min_update_rel = std::min(u.min_update_rel, std::sqrt(d2 / p2));
  }
  u.c = compare_tensors(dg, dr, zero);
  return u;
}

NamedValues optimizer_state_values(TrainStep& step) {
  NamedValues out;
  for (const auto& [name, t] : step.optimizer().state()) out.emplace_back(name, t.to_host_f32());
  return out;
}

}  // namespace

std::vector<Measurement> ga3_optimizer_step(Device& dev, DType dtype, Preset preset, uint64_t seed) {
  std::vector<Measurement> out;
  const double tol = tol::kGradAccumRelL2(dtype);
  // SGD with a learning rate large enough that one step moves every tensor far
  // above fp32 parameter rounding (asserted below): the update, not the parameter,
  // is what is compared. AdamW at its defaults, two steps.
  OptimizerConfig sgd;
  sgd.kind = OptimizerKind::sgd;
  sgd.sgd.lr = tol::kGradAccumSgdLr;
  OptimizerConfig adamw;
  adamw.kind = OptimizerKind::adamw;
  const int64_t micro_batches[] = {1, 4};

  for (const ModelCase& mc : model_cases()) {
    const StepConfig full_cfg = mc.config(dtype, kEffectiveBatch, preset);
    const Batch batch = accum_batch(dev, full_cfg, seed);
    const ZeroGradientRule zero = exact_zero_gradients(full_cfg);
    // Optimizer state is named "<param>.exp_avg" / ".exp_avg_sq": noise for the
    // parameters whose exact gradient is zero, as their gradients are.
    const ZeroGradientRule state_zero = [&zero](const std::string& name) {
      const size_t dot = name.rfind('.');
      return zero && dot != std::string::npos && zero(name.substr(0, dot));
    };
    struct After {
      NamedValues params, state;
      bool skipped = false;
    };
    // `steps` optimizer steps on the same batch; the state is read after the first.
    auto run = [&](const StepConfig& base, const OptimizerConfig& opt, int steps, NamedValues* initial) {
      StepConfig cfg = base;
      cfg.optimizer = opt;
      TrainStep step(dev, cfg);
      if (initial) *initial = parameter_values(step);
      After a;
      for (int s = 0; s < steps; ++s) {
        a.skipped = step.step(batch).skipped || a.skipped;
        if (s == 0) a.state = optimizer_state_values(step);
      }
      a.params = parameter_values(step);
      return a;
    };
    auto fill = [&](Measurement& m, int64_t mb, const char* opt_name, const char* norm, const After& a) {
      describe(m, dev, dtype, mc.name);
      m.config = accum_config(mb, norm);
      m.config["optimizer"] = opt_name;
      m.details["skipped_step"] = a.skipped;
    };

    // ---- SGD: one step; the update is -lr g, so its error is the gradient's.
    NamedValues p0;
    const After full = run(full_cfg, sgd, 1, &p0);
    UpdateCompare resolution;
    for (int64_t mb : micro_batches) {
      const After acc = run(mc.config(dtype, mb, preset), sgd, 1, nullptr);
      const UpdateCompare u = compare_updates(acc.params, full.params, p0, zero);
      resolution = u;
      Measurement m = make_check("GA-3", kGa3SgdTitle,
                                 u.c.max_rel_l2, tol + u.rounding_floor);
      fill(m, mb, "sgd", "mean_div_k", acc);
      m.metric = "max_tensor_rel_l2_of_update";
      m.tolerance_reason = fmt::format("{}; plus the fp32 rounding of p0 + update ({:.2g})", tol::kGradAccumReason,
                                       u.rounding_floor);
      m.details.update(compare_details(u.c));
      m.details["rounding_floor"] = u.rounding_floor;
      m.details["min_update_over_param"] = json_number(u.min_update_rel);
      out.push_back(std::move(m));
    }
    // The update must be far above what parameter rounding can hide, else the
    // check above could not see an update that is a few percent wrong. This is the
    // probe's resolution (of the learning rate and the model, not of the code under
    // test), so it is a precondition: the property refuses to judge without it.
    HR_CHECK(resolution.rounding_floor <= tol::kGradAccumMaxFloorShare * tol,
             "GA-3 ({}, {}): the SGD probe's update is too small to judge: fp32 rounding of p0 + update is {:.3g} "
             "of it, more than {} of the bound {:.3g} (harness/tolerances.hpp kGradAccumSgdLr)",
             mc.name, dtype_name(dtype), resolution.rounding_floor, tol::kGradAccumMaxFloorShare, tol);
    {  // Gross: without the division by K the update is K times too large.
      StepConfig cfg = mc.config(dtype, 4, preset);
      cfg.loss_norm = LossNormalization::no_division;
      const After b = run(cfg, sgd, 1, nullptr);
      const UpdateCompare u = compare_updates(b.params, full.params, p0, zero);
      Measurement m = make_negative_control(
          "GA-3", "one SGD step without the division by K moves the parameters K times too far", u.c.max_rel_l2,
          tol + u.rounding_floor, check_name("GA-3", kGa3SgdTitle));
      fill(m, 4, "sgd", "no_division", b);
      m.metric = "max_tensor_rel_l2_of_update";
      m.tolerance_reason = tol::kGradAccumReason;
      m.details.update(compare_details(u.c));
      m.details["expected_error"] = kEffectiveBatch / 4 - 1;
      out.push_back(std::move(m));
    }
    {  // Subtle: the step from a gradient accumulated in a 16-bit buffer.
      const DType buffer = subtle_buffer_dtype(dtype);
      const int64_t mb = tol::kGradAccumSubtleBufferMicroBatch(dtype);
      const After b = run(with_buffer(mc.config(dtype, mb, preset), buffer), sgd, 1, nullptr);
      const UpdateCompare u = compare_updates(b.params, full.params, p0, zero);
      Measurement m = make_subtle_control(
          "GA-3", fmt::format("one SGD step from gradients accumulated in a {} buffer is flagged", dtype_name(buffer)),
          u.c.max_rel_l2, tol + u.rounding_floor, check_name("GA-3", kGa3SgdTitle));
      fill(m, mb, "sgd", "mean_div_k", b);
      m.config["grad_accum"] = dtype_name(buffer);
      m.metric = "max_tensor_rel_l2_of_update";
      m.tolerance_reason = tol::kGradAccumReason;
      m.details.update(compare_details(u.c));
      out.push_back(std::move(m));
    }

    // ---- AdamW: the moments after the first step are functions of that step's
    // gradient alone (m = (1 - b1) g, v = (1 - b2) g^2), so they carry GA-1's bound
    // (twice it for v: squaring doubles a relative error). The parameters after two
    // steps are compared as updates, with Adam's own bound (see tolerances.hpp).
    NamedValues a0;
    const After afull = run(full_cfg, adamw, 2, &a0);
    for (int64_t mb : micro_batches) {
      const After acc = run(mc.config(dtype, mb, preset), adamw, 2, nullptr);
      const TensorsCompare sc = compare_tensors(acc.state, afull.state, state_zero);
      Measurement ms = make_check("GA-3", kGa3MomentsTitle,
                                  sc.max_rel_l2, 2 * tol);
      fill(ms, mb, "adamw", "mean_div_k", acc);
      ms.metric = "max_tensor_rel_l2_of_moments";
      ms.tolerance_reason = "2 x GA-1's bound: v = (1 - b2) g^2 doubles the gradient's relative error";
      ms.details.update(compare_details(sc));
      out.push_back(std::move(ms));

      const UpdateCompare u = compare_updates(acc.params, afull.params, a0, zero);
      Measurement mp = make_check("GA-3", kGa3AdamTitle,
                                  u.c.global_rel_l2, tol::grad_accum_adam_update_rel_l2(dtype) + u.rounding_floor);
      fill(mp, mb, "adamw", "mean_div_k", acc);
      mp.config["steps"] = 2;
      mp.metric = "global_rel_l2_of_update";
      mp.tolerance_reason = tol::kGradAccumAdamStepReason;
      mp.details.update(compare_details(u.c));
      mp.details["rounding_floor"] = u.rounding_floor;
      out.push_back(std::move(mp));
    }
    {  // Subtle: the second step's bias corrections are the first's (the step count
       // never advances): m_hat 1.9x and sqrt(v_hat) 1.4x too small at step 2.
      StepConfig cfg = mc.config(dtype, 4, preset);
      cfg.fault_step_count_frozen = true;
      const After b = run(cfg, adamw, 2, nullptr);
      const UpdateCompare u = compare_updates(b.params, afull.params, a0, zero);
      Measurement m = make_subtle_control("GA-3", "two AdamW steps that both use step 1's bias corrections are flagged",
                                          u.c.global_rel_l2,
                                          tol::grad_accum_adam_update_rel_l2(dtype) + u.rounding_floor,
                                          check_name("GA-3", kGa3AdamTitle));
      fill(m, 4, "adamw", "mean_div_k", b);
      m.config["steps"] = 2;
      m.config["fault"] = "step_count_frozen";
      m.metric = "global_rel_l2_of_update";
      m.tolerance_reason = tol::kGradAccumAdamStepReason;
      m.details.update(compare_details(u.c));
      out.push_back(std::move(m));
    }
    {  // Subtle: the moments from a gradient accumulated in a 16-bit buffer.
      const DType buffer = subtle_buffer_dtype(dtype);
      const int64_t mb = tol::kGradAccumSubtleBufferMicroBatch(dtype);
      const After b = run(with_buffer(mc.config(dtype, mb, preset), buffer), adamw, 1, nullptr);
      const TensorsCompare sc = compare_tensors(b.state, afull.state, state_zero);
      Measurement m = make_subtle_control(
          "GA-3", fmt::format("AdamW moments from gradients accumulated in a {} buffer are flagged", dtype_name(buffer)),
          sc.max_rel_l2, 2 * tol, check_name("GA-3", kGa3MomentsTitle));
      fill(m, mb, "adamw", "mean_div_k", b);
      m.config["grad_accum"] = dtype_name(buffer);
      m.metric = "max_tensor_rel_l2_of_moments";
      m.tolerance_reason = "2 x GA-1's bound";
      m.details.update(compare_details(sc));
      out.push_back(std::move(m));
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
  int64_t window_tokens = 0;
  for (int64_t len : shuffled) window_tokens += len - 1;

  auto run = [&](const StepConfig& cfg, const Batch& b, const GradRun& ref, TensorsCompare* c) {
    const GradRun acc = gradients_of(dev, cfg, b);
    *c = compare_tensors(acc.grads, ref.grads, zero);
    return std::fabs(acc.loss - ref.loss) / std::fabs(ref.loss);
  };
  auto config = [&](int64_t mb, LossNormalization norm) {
    StepConfig cfg = accum_transformer_config(dtype, mb, preset);
    cfg.loss_norm = norm;
    return cfg;
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
    m.details["window_tokens"] = window_tokens;
    m.details["anchor"] = anchor;
  };

  nlohmann::json series = nlohmann::json::array();
  std::vector<double> ks, errs;  // ascending K
  std::vector<int64_t> mbs = accumulating_micro_batches();
  std::sort(mbs.rbegin(), mbs.rend());
  for (int64_t mb : mbs) {
    const int64_t K = kEffectiveBatch / mb;
    TensorsCompare c;

    double loss_rel = run(config(mb, LossNormalization::sum_div_window_items), batch, full, &c);
    Measurement ok = make_check(
        "GA-4", kGa4Title,
        c.max_rel_l2, tol);
    fill(ok, mb, LossNormalization::sum_div_window_items, c, loss_rel, "shuffled");
    out.push_back(std::move(ok));

    loss_rel = run(config(mb, LossNormalization::mean_div_k), batch, full, &c);
    series.push_back({{"accum_steps", K}, {"micro_batch", mb}, {"max_tensor_rel_l2", json_number(c.max_rel_l2)},
                      {"global_rel_l2", json_number(c.global_rel_l2)}, {"loss_rel_error", loss_rel}});
    ks.push_back(static_cast<double>(K));
    errs.push_back(c.global_rel_l2);

    loss_rel = run(config(mb, LossNormalization::mean_div_k), sorted_batch, sorted_full, &c);
    Measurement bad = make_negative_control(
        "GA-4", "padded rows: per-micro-batch token means divided by K are flagged by GA-1's check", c.max_rel_l2, tol, check_name("GA-4", kGa4Title));
    fill(bad, mb, LossNormalization::mean_div_k, c, loss_rel, "sorted_by_length");
    out.push_back(std::move(bad));
  }

  {  // Subtle: the window's token count off by one (error 1 / (tokens + 1)) where
     // that lies within 100x of the bound; in fp32 the 16-bit buffer instead.
    const int64_t mb = dtype == DType::f32 ? tol::kGradAccumSubtleBufferMicroBatch(dtype) : 4;
    StepConfig cfg = config(mb, LossNormalization::sum_div_window_items);
    const char* fault;
    if (dtype == DType::f32) {
      cfg = with_buffer(cfg, subtle_buffer_dtype(dtype));
      fault = "padded rows: the window's gradients accumulated in an fp16 buffer are flagged";
    } else {
      cfg.loss_norm = LossNormalization::sum_div_window_items_plus_one;
      fault = "padded rows: the window's real-token count off by one is flagged";
    }
    TensorsCompare c;
    const double loss_rel = run(cfg, batch, full, &c);
    Measurement s = make_subtle_control("GA-4", fault, c.max_rel_l2, tol, check_name("GA-4", kGa4Title));
    fill(s, mb, cfg.loss_norm, c, loss_rel, "shuffled");
    if (cfg.precision.grad_accum != DType::f32) s.config["grad_accum"] = dtype_name(cfg.precision.grad_accum);
    if (dtype != DType::f32) s.details["expected_error"] = 1.0 / static_cast<double>(window_tokens + 1);
    out.push_back(std::move(s));
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
                                        errs.back() / errs.front(), 1.0, check_name("GA-4", kGa4Title));
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
                                  [](RunContext& c) { return every_float_dtype(c, ga1_accumulated_gradient); }, ""});
HR_REGISTER_PROPERTY(PropertySpec{"GA-2", "without the division by K the gradient is K times too large, and caught",
                                  1.0, [](RunContext& c) { return every_float_dtype(c, ga2_no_division); }, ""});
HR_REGISTER_PROPERTY(PropertySpec{"GA-3", "one optimizer step from accumulated gradients equals the large-batch step",
                                  1.5, [](RunContext& c) { return every_float_dtype(c, ga3_optimizer_step); }, ""});
HR_REGISTER_PROPERTY(PropertySpec{"GA-4", "padded rows: window token count normalises, per-micro-batch means do not",
                                  1.5, [](RunContext& c) { return every_float_dtype(c, ga4_variable_length); }, ""});

}  // namespace
}  // namespace hr::props
