// Configurations, batches and tensor comparisons shared by the accumulation and
// batch-norm properties and the micro-batch sweep (see accum_support.hpp).
#include "harness/properties/accum_support.hpp"

#include <fmt/format.h>

#include <cmath>

#include "harness/check.hpp"
#include "harness/data/synthetic.hpp"
#include "harness/results/results.hpp"

namespace hr::props {

std::vector<int64_t> accum_micro_batches() { return {1, 2, 4, 8, 16, 32}; }

StepConfig accum_mlp_config(DType dtype, int64_t micro_batch, Preset preset, NormKind norm) {
  StepConfig c;
  c.model = ModelKind::mlp;
  c.mlp.in_dim = preset == Preset::quick ? 32 : 256;
  c.mlp.width = preset == Preset::quick ? 64 : 1024;
  c.mlp.out_dim = preset == Preset::quick ? 16 : 64;
  c.mlp.layers = preset == Preset::quick ? 4 : 6;
  c.mlp.norm = norm;
  c.mlp.task = MlpTask::regression;
  c.mlp.dropout = 0.f;
  c.batch = kEffectiveBatch;
  c.micro_batch = micro_batch;
  c.precision.compute = dtype;
  c.optimizer.kind = OptimizerKind::sgd;
  return c;
}

StepConfig accum_transformer_config(DType dtype, int64_t micro_batch, Preset preset) {
  StepConfig c;
  c.model = ModelKind::transformer;
  auto& t = c.transformer;
  t.vocab = preset == Preset::quick ? 64 : 512;
  t.max_positions = preset == Preset::quick ? 32 : 128;
  t.d_model = preset == Preset::quick ? 32 : 128;
  t.heads = 4;
  t.layers = preset == Preset::quick ? 2 : 4;
  t.dropout = 0.f;
  c.seq_len = t.max_positions;
  c.batch = kEffectiveBatch;
  c.micro_batch = micro_batch;
  c.precision.compute = dtype;
  c.optimizer.kind = OptimizerKind::sgd;
  return c;
}

Batch accum_batch(Device& dev, const StepConfig& cfg, uint64_t seed, const std::vector<int64_t>& lengths) {
  if (cfg.model == ModelKind::mlp) return make_mlp_batch(dev, cfg.mlp, cfg.batch, seed);
  return make_lm_batch(dev, cfg.transformer, cfg.batch, cfg.seq_len, seed, lengths);
}

NamedValues gradient_values(const TrainStep& step) {
  NamedValues out;
  for (const auto& [name, g] : step.gradients()) out.emplace_back(name, g.to_host_f32());
  return out;
}

NamedValues parameter_values(TrainStep& step) {
  NamedValues out;
  for (const Param& p : step.params().all()) out.emplace_back(p.name, p.master.to_host_f32());
  return out;
}

NamedValues buffer_values(TrainStep& step) {
  NamedValues out;
  for (const auto& [name, t] : step.model().buffers()) out.emplace_back(name, t.to_host_f32());
  return out;
}

namespace {
bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}
}  // namespace

ZeroGradientRule exact_zero_gradients(const StepConfig& cfg) {
  if (cfg.model == ModelKind::transformer)
    return [](const std::string& name) { return ends_with(name, ".attn.k.bias"); };
  if (cfg.mlp.norm != NormKind::batchnorm) return {};
  // Every layer but the last feeds a norm (harness/models/mlp.hpp).
  const int64_t normed_layers = cfg.mlp.layers - 1;
  return [normed_layers](const std::string& name) {
    for (int64_t i = 0; i < normed_layers; ++i)
      if (name == fmt::format("layers.{}.bias", i)) return true;
    return false;
  };
}

TensorsCompare compare_tensors(const NamedValues& got, const NamedValues& ref, const ZeroGradientRule& zero) {
  HR_CHECK(got.size() == ref.size(), "compare_tensors: {} tensors against {}", got.size(), ref.size());
  struct Sums {
    double diff2 = 0, ref2 = 0, got2 = 0;
    bool nan = false;
  };
  std::vector<Sums> sums(got.size());
  Sums all;
  for (size_t t = 0; t < got.size(); ++t) {
    HR_CHECK(got[t].first == ref[t].first && got[t].second.size() == ref[t].second.size(),
             "compare_tensors: tensor {} is '{}' ({} values) against '{}' ({} values)", t, got[t].first,
             got[t].second.size(), ref[t].first, ref[t].second.size());
    Sums& s = sums[t];
    for (size_t i = 0; i < got[t].second.size(); ++i) {
      const double a = got[t].second[i], b = ref[t].second[i];
      if (!std::isfinite(a) || !std::isfinite(b)) s.nan = true;
      s.diff2 += (a - b) * (a - b);
      s.ref2 += b * b;
      s.got2 += a * a;
    }
    all.diff2 += s.diff2;
    all.ref2 += s.ref2;
    all.got2 += s.got2;
    all.nan = all.nan || s.nan;
  }
  HR_CHECK(all.ref2 > 0, "compare_tensors: the reference is all zero, so a comparison could not fail");
  TensorsCompare r;
  r.ref_norm = std::sqrt(all.ref2);
  r.got_norm = std::sqrt(all.got2);
  r.global_rel_l2 = all.nan ? NAN : std::sqrt(all.diff2 / all.ref2);
  r.max_rel_l2 = 0;
  for (size_t t = 0; t < got.size(); ++t) {
    const Sums& s = sums[t];
    const bool vs_global = zero && zero(ref[t].first);
    double e;
    if (s.nan) e = NAN;
    else if (vs_global) e = std::sqrt(s.diff2 / all.ref2);
    else if (s.ref2 > 0) e = std::sqrt(s.diff2 / s.ref2);
    else e = s.diff2 == 0 ? 0.0 : INFINITY;
    r.per_tensor[ref[t].first] = vs_global ? nlohmann::json{{"rel_l2_vs_all", json_number(e)}} : json_number(e);
    if (!(e <= r.max_rel_l2)) {  // NaN wins, so a NaN anywhere is the reported maximum
      if (std::isnan(r.max_rel_l2)) continue;
      r.max_rel_l2 = e;
      r.worst = ref[t].first;
    }
  }
  return r;
}

void describe(Measurement& m, const Device& dev, DType dtype, const std::string& model) {
  m.backend = backend_name(dev.kind());
  m.dtype = dtype_name(dtype);
  m.model = model;
}

CheckFamily::CheckFamily(std::vector<Measurement>& out, const Device& dev, DType dtype, std::string model,
                         std::string id, std::string title, double tolerance, std::string metric, std::string reason)
    : out_(out),
      dev_(dev),
      dtype_(dtype),
      model_(std::move(model)),
      id_(std::move(id)),
      title_(std::move(title)),
      tolerance_(tolerance),
      metric_(std::move(metric)),
      reason_(std::move(reason)) {}

Measurement& CheckFamily::add(Measurement m, nlohmann::json config, nlohmann::json details) {
  describe(m, dev_, dtype_, model_);
  m.config = std::move(config);
  m.metric = metric_;
  m.tolerance_reason = reason_;
  // A control's own details (make_negative_control's "not_caught") stay beside the caller's.
  for (auto& [k, v] : details.items()) m.details[k] = std::move(v);
  out_.push_back(std::move(m));
  return out_.back();
}

Measurement& CheckFamily::check(double error, nlohmann::json config, nlohmann::json details) {
  return add(make_check(id_, title_, error, tolerance_), std::move(config), std::move(details));
}

Measurement& CheckFamily::gross(std::string title, double error, nlohmann::json config, nlohmann::json details) {
  return add(make_negative_control(id_, std::move(title), error, tolerance_, name()), std::move(config),
             std::move(details));
}

Measurement& CheckFamily::subtle(std::string title, double error, nlohmann::json config, nlohmann::json details) {
  return add(make_subtle_control(id_, std::move(title), error, tolerance_, name()), std::move(config),
             std::move(details));
}

std::vector<Measurement> every_float_dtype(RunContext& ctx, PerDTypeProperty fn) {
  std::vector<Measurement> out;
  for (DType d : kFloatDTypes) {
    if (ctx.progress) ctx.progress(dtype_name(d));
    std::vector<Measurement> ms;
    try {
      ms = fn(ctx.device, d, ctx.preset, ctx.seed);
    } catch (const OutOfMemory&) {
      throw;  // the device, not this dtype: the runner records it for the property
    } catch (const std::exception& e) {
      // One dtype's failure is recorded as its own error and the others still run.
      Measurement m = make_error_measurement("", "", backend_name(ctx.device.kind()), e.what());
      m.dtype = dtype_name(d);
      ms = {m};
    }
    out.insert(out.end(), std::make_move_iterator(ms.begin()), std::make_move_iterator(ms.end()));
  }
  return out;
}

}  // namespace hr::props
