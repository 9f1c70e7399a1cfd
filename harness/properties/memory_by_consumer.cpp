// MEM-1 (analytical bytes per consumer against the tracker) and MEM-2 (the field
// guide's out-of-memory triage), see memory_by_consumer.hpp.
#include "harness/properties/memory_by_consumer.hpp"

#include <algorithm>
#include <cmath>

#include "harness/check.hpp"
#include "harness/data/synthetic.hpp"
#include "harness/step/train_step.hpp"

namespace hr {
namespace {

constexpr Consumer kFour[] = {Consumer::weights, Consumer::gradients, Consumer::optimizer_state,
                              Consumer::activations};

Batch batch_for(Device& dev, const StepConfig& cfg, uint64_t seed) {
  if (cfg.model == ModelKind::mlp) return make_mlp_batch(dev, cfg.mlp, cfg.batch, seed);
  return make_lm_batch(dev, cfg.transformer, cfg.batch, cfg.seq_len, seed);
}

// The measurement's identity fields from a configuration.
void describe(Measurement& m, Device& dev, const StepConfig& cfg) {
  m.backend = backend_name(dev.kind());
  m.dtype = dtype_name(cfg.precision.compute);
  m.model = model_kind_name(cfg.model);
  nlohmann::json c;
  c["micro_batch"] = cfg.micro_batch;
  c["batch"] = cfg.batch;
  c["checkpoint_every_k"] = cfg.checkpoint.every_k_blocks;
  c["optimizer"] = optimizer_kind_name(cfg.optimizer.kind);
  if (cfg.model == ModelKind::transformer) {
    c["layers"] = cfg.transformer.layers;
    c["d_model"] = cfg.transformer.d_model;
    c["heads"] = cfg.transformer.heads;
    c["seq_len"] = cfg.seq_len;
    c["vocab"] = cfg.transformer.vocab;
    c["attention"] = cfg.transformer.memory_efficient_attention ? "memory_efficient" : "naive";
  } else {
    c["layers"] = cfg.mlp.layers;
    c["width"] = cfg.mlp.width;
    c["norm"] = norm_kind_name(cfg.mlp.norm);
    if (cfg.mlp.bn_virtual_batch > 0) c["bn_virtual_batch"] = cfg.mlp.bn_virtual_batch;
  }
  m.config = c;
}

// Restores the device's budget however the scope is left.
class BudgetGuard {
 public:
  explicit BudgetGuard(MemoryTracker& t) : t_(t), prev_(t.budget()) {}
  ~BudgetGuard() { t_.set_budget(prev_); }
  BudgetGuard(const BudgetGuard&) = delete;
  BudgetGuard& operator=(const BudgetGuard&) = delete;

 private:
  MemoryTracker& t_;
  std::optional<size_t> prev_;
};

}  // namespace

Measurement check_memory_model(Device& dev, const StepConfig& cfg) {
  const MemoryPrediction pred = predict_memory(cfg);
  const MemorySnapshot before = dev.memory().snapshot();
  dev.memory().reset_peak();
  MemorySnapshot after;
  {
    const Batch batch = batch_for(dev, cfg, 1);
    TrainStep step(dev, cfg);
    step.step(batch);
    after = dev.memory().snapshot();
  }
  double worst = 0;
  nlohmann::json per = nlohmann::json::object();
  for (Consumer c : kFour) {
    const double measured = static_cast<double>(after.peak(c) - before.current(c));
    const double predicted = static_cast<double>(pred.of(c));
    const double err = measured == predicted ? 0.0 : std::fabs(measured - predicted) / std::max(measured, 1.0);
    worst = std::max(worst, err);
    per[consumer_name(c)] = {{"predicted_bytes", predicted}, {"measured_peak_bytes", measured}, {"rel_error", err}};
  }
  Measurement m = make_check("MEM-1", "analytical bytes per consumer match the tracker's peaks", worst,
                             kMemoryModelRelError);
  describe(m, dev, cfg);
  m.metric = "max_rel_error_over_consumers";
  m.tolerance_reason = "PROPERTIES.md MEM-1: under 5% per configuration";
  m.details["consumers"] = per;
  m.details["parameters"] = pred.parameters;
  m.details["activation_terms"] = pred.breakdown;
  m.details["workspace_peak_bytes"] = after.peak(Consumer::workspace) - before.current(Consumer::workspace);
  return m;
}

std::vector<StepConfig> memory_model_grid(Preset preset) {
  const bool full = preset == Preset::full;
  std::vector<StepConfig> grid;
  StepConfig t;
  t.model = ModelKind::transformer;
  t.transformer.vocab = full ? 8192 : 128;
  t.transformer.max_positions = full ? 1024 : 128;
  t.transformer.d_model = full ? 512 : 64;
  t.transformer.heads = full ? 8 : 4;
  t.transformer.layers = 2;
  t.seq_len = full ? 256 : 32;
  t.batch = full ? 8 : 4;
  t.micro_batch = full ? 4 : 2;
  auto add = [&](StepConfig c, auto&& edit) {
    edit(c);
    grid.push_back(c);
  };
  add(t, [](StepConfig&) {});
  add(t, [](StepConfig& c) { c.transformer.layers = 4; });
  add(t, [&](StepConfig& c) { c.transformer.d_model *= 2, c.transformer.heads *= 2; });
  add(t, [](StepConfig& c) { c.micro_batch *= 2, c.batch *= 2; });
  add(t, [](StepConfig& c) { c.seq_len *= 2; });
  add(t, [](StepConfig& c) { c.precision.compute = DType::bf16; });
  add(t, [](StepConfig& c) { c.precision.compute = DType::f16; });
  add(t, [](StepConfig& c) { c.transformer.layers = 4, c.checkpoint.every_k_blocks = 1; });
  add(t, [](StepConfig& c) { c.transformer.layers = 5, c.checkpoint.every_k_blocks = 2; });
  add(t, [](StepConfig& c) { c.seq_len *= 2, c.transformer.memory_efficient_attention = true; });
  add(t, [](StepConfig& c) {
    c.transformer.layers = 4, c.checkpoint.every_k_blocks = 2, c.transformer.memory_efficient_attention = true,
    c.precision.compute = DType::bf16;
  });
  add(t, [](StepConfig& c) { c.optimizer.kind = OptimizerKind::sgd, c.optimizer.sgd.momentum = 0.9f; });

  StepConfig m;
  m.model = ModelKind::mlp;
  m.mlp.in_dim = full ? 512 : 32;
  m.mlp.width = full ? 2048 : 128;
  m.mlp.out_dim = full ? 256 : 16;
  m.mlp.layers = 4;
  m.batch = full ? 2048 : 32;
  m.micro_batch = full ? 1024 : 16;
  add(m, [](StepConfig&) {});
  add(m, [](StepConfig& c) { c.mlp.norm = NormKind::layernorm, c.precision.compute = DType::bf16; });
  add(m, [](StepConfig& c) { c.mlp.norm = NormKind::batchnorm, c.mlp.bn_virtual_batch = 4; });
  add(m, [](StepConfig& c) { c.mlp.layers = 6, c.checkpoint.every_k_blocks = 2, c.mlp.dropout = 0.1f; });
  add(m, [](StepConfig& c) {
    c.precision.compute = DType::f16, c.optimizer.kind = OptimizerKind::sgd, c.mlp.task = MlpTask::classification;
  });
  return grid;
}

std::vector<Measurement> mem1_memory_model(RunContext& ctx) {
  std::vector<Measurement> out;
  for (const StepConfig& cfg : memory_model_grid(ctx.preset)) {
    if (ctx.progress) ctx.progress(fmt::format("MEM-1 {}", nlohmann::json(cfg).dump()));
    out.push_back(check_memory_model(ctx.device, cfg));
  }
  return out;
}

HR_REGISTER_PROPERTY(PropertySpec{"MEM-1", "analytical memory per consumer against the tracker", 3.0,
                                  mem1_memory_model});

const char* memory_verdict_name(MemoryVerdict v) {
  switch (v) {
    case MemoryVerdict::fits: return "fits";
    case MemoryVerdict::activations: return "activations";
    case MemoryVerdict::static_state: return "weights_gradients_optimizer_state";
  }
  return "?";
}

MemoryDiagnosis diagnose_memory(Device& dev, const StepConfig& cfg, size_t budget_bytes, int64_t short_seq_len) {
  validate(cfg);
  MemoryDiagnosis d;
  d.small = cfg;
  const int64_t rows = cfg.model == ModelKind::mlp && cfg.mlp.norm == NormKind::batchnorm ? 2 : 1;
  d.small.batch = d.small.micro_batch = rows;
  if (d.small.model == ModelKind::mlp) d.small.mlp.bn_virtual_batch = 0;
  if (cfg.model == ModelKind::transformer) d.small.seq_len = std::min(cfg.seq_len, short_seq_len);

  BudgetGuard guard(dev.memory());
  dev.memory().set_budget(dev.memory().snapshot().total_current_bytes + budget_bytes);
  auto attempt = [&](const StepConfig& c, std::string* why) {
    try {
      const Batch batch = batch_for(dev, c, 1);
      TrainStep step(dev, c);
      step.step(batch);
      return true;
    } catch (const OutOfMemory& e) {
      *why = e.what();
      return false;
    }
  };
  if (attempt(cfg, &d.oom_message)) {
    d.verdict = MemoryVerdict::fits;
  } else {
    d.verdict = attempt(d.small, &d.small_oom_message) ? MemoryVerdict::activations : MemoryVerdict::static_state;
  }
  return d;
}

std::vector<Measurement> mem2_practical_test(RunContext& ctx) {
  Device& dev = ctx.device;
  const bool full = ctx.preset == Preset::full;
  struct Case {
    std::string name;
    StepConfig cfg;
    MemoryVerdict expected;
    size_t budget = 0;
  };
  std::vector<Case> cases;

  // A small transformer on long, wide batches: activations dominate.
  StepConfig act;
  act.model = ModelKind::transformer;
  act.transformer.vocab = 256;
  act.transformer.d_model = 64;
  act.transformer.heads = 4;
  act.transformer.layers = 2;
  act.transformer.max_positions = full ? 1024 : 256;
  act.seq_len = act.transformer.max_positions;
  act.batch = act.micro_batch = full ? 64 : 8;
  // A larger transformer on a tiny batch: its weights, gradients and AdamW
  // state alone exceed the budget.
  StepConfig stat = act;
  stat.transformer.vocab = full ? 32768 : 2048;
  stat.transformer.d_model = full ? 1024 : 128;
  stat.transformer.heads = 8;
  stat.transformer.layers = 4;
  stat.seq_len = 16;
  stat.batch = stat.micro_batch = 1;
  // An MLP on a large batch: activations again.
  StepConfig mlp;
  mlp.model = ModelKind::mlp;
  mlp.mlp.in_dim = 64;
  mlp.mlp.width = 256;
  mlp.mlp.out_dim = 16;
  mlp.mlp.layers = 4;
  mlp.batch = mlp.micro_batch = full ? 65536 : 2048;

  auto budget_between = [](const StepConfig& c, double activation_fraction) {
    const MemoryPrediction p = predict_memory(c);
    return static_cast<size_t>(static_cast<double>(p.static_bytes()) +
                               activation_fraction * static_cast<double>(p.activations));
  };
  cases.push_back({"transformer_activation_bound", act, MemoryVerdict::activations, budget_between(act, 0.25)});
  cases.push_back({"mlp_activation_bound", mlp, MemoryVerdict::activations, budget_between(mlp, 0.25)});
  cases.push_back({"transformer_weight_bound", stat, MemoryVerdict::static_state,
                   static_cast<size_t>(0.8 * static_cast<double>(predict_memory(stat).static_bytes()))});
  {
    const MemoryPrediction p = predict_memory(act);
    cases.push_back({"transformer_fits", act, MemoryVerdict::fits, 4 * (p.static_bytes() + p.activations)});
  }

  std::vector<Measurement> out;
  for (const Case& k : cases) {
    if (ctx.progress) ctx.progress("MEM-2 " + k.name);
    const MemoryDiagnosis d = diagnose_memory(dev, k.cfg, k.budget);
    Measurement m = make_check("MEM-2", "the micro-batch-1 / short-sequence rerun names what does not fit",
                               d.verdict == k.expected ? 0.0 : 1.0, 0.0);
    describe(m, dev, k.cfg);
    m.config["case"] = k.name;
    m.config["budget_bytes"] = k.budget;
    m.metric = "misclassified";
    m.tolerance_reason = "a classification: it is right or wrong";
    m.details = {{"verdict", memory_verdict_name(d.verdict)},
                 {"expected", memory_verdict_name(k.expected)},
                 {"oom", d.oom_message},
                 {"small_rerun_oom", d.small_oom_message},
                 {"small_rerun", {{"batch", d.small.batch}, {"seq_len", d.small.seq_len}}}};
    out.push_back(m);
  }
  return out;
}

HR_REGISTER_PROPERTY(PropertySpec{"MEM-2", "out-of-memory triage: activations or the other three consumers", 2.0,
                                  mem2_practical_test});

}  // namespace hr
