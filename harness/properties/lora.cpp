// LR: low-rank adapters (Hu et al. 2021) on the transformer's q and v projections.
// LR-1 identity at initialisation (B = 0), LR-2 the merged weight W + (alpha/r) B A
// against the adapter path, LR-4 the frozen base's gradient and optimizer bytes as
// the tracker sees them; each with a gross and a subtle control.
#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "harness/check.hpp"
#include "harness/compare.hpp"
#include "harness/data/synthetic.hpp"
#include "harness/models/params.hpp"
#include "harness/registry.hpp"
#include "harness/step/lora_merge.hpp"
#include "harness/step/train_step.hpp"
#include "harness/tolerances.hpp"

namespace hr::props {
namespace {

constexpr int64_t kLoraRank = 4;
constexpr float kLoraAlpha = 8.f;

StepConfig lora_config(bool lora) {
  StepConfig c;
  c.model = ModelKind::transformer;
  c.transformer.vocab = 64;
  c.transformer.max_positions = 32;
  c.transformer.d_model = 32;
  c.transformer.heads = 4;
  c.transformer.layers = 2;
  c.seq_len = 16;
  c.batch = 2;
  c.micro_batch = 2;
  c.optimizer.kind = OptimizerKind::adamw;
  if (lora) c.adapters.kind = AdapterKind::lora, c.adapters.rank = kLoraRank, c.adapters.alpha = kLoraAlpha;
  return c;
}

void describe(Measurement& m, Device& dev, const StepConfig& cfg, const char* metric) {
  m.backend = backend_name(dev.kind());
  m.dtype = "fp32";
  m.model = "transformer";
  m.config = {{"d_model", cfg.transformer.d_model}, {"layers", cfg.transformer.layers},
              {"lora_rank", kLoraRank},           {"lora_alpha", kLoraAlpha},
              {"adapted", "q, v"}};
  m.metric = metric;
  m.tolerance_reason = "harness/tolerances.hpp, LR block";
}

void set_host(Param& p, const std::vector<float>& v) {
  p.master.copy_from(Tensor::from_host(p.master.device(), v, p.master.shape(), DType::f32, Consumer::workspace));
}

// Every B of the step's adapters drawn normal(0, std) from its own Philox stream.
void set_b(TrainStep& step, uint64_t seed, float std) {
  uint64_t k = 0;
  for (Param& p : step.params().all())
    if (p.name.find("lora_B") != std::string::npos)
      set_host(p, philox_normal(seed, (uint64_t{1} << 24) * ++k, p.master.numel(), 0.f, std));
  step.params().sync_compute();
}

// LR-1: B = 0 at initialisation, so the adapted model's loss is the base model's,
// bitwise, on each of kLr1Batches batches. Error: the number of losses that differ.
constexpr int kLr1Batches = 4;
std::vector<Measurement> lr1_identity(RunContext& ctx) {
  std::vector<Measurement> out;
  Device& dev = ctx.device;
  const StepConfig base_cfg = lora_config(false), cfg = lora_config(true);
  std::vector<Batch> batches;
  for (int j = 0; j < kLr1Batches; ++j)
    batches.push_back(make_lm_batch(dev, cfg.transformer, cfg.batch, cfg.seq_len, ctx.seed * 7919 + j));
  TrainStep base(dev, base_cfg);
  std::vector<double> l0;
  for (const Batch& b : batches) l0.push_back(base.loss(b));
  auto mismatches = [&](TrainStep& s) {
    double n = 0;
    for (size_t j = 0; j < batches.size(); ++j) n += s.loss(batches[j]) != l0[j];
    return n;
  };
  auto emit = [&](Measurement m) {
    describe(m, dev, cfg, "bitwise_mismatches (losses of 4 batches)");
    out.push_back(std::move(m));
  };
  {
    TrainStep s(dev, cfg);
    emit(make_check("LR-1", "LoRA with B = 0: the adapted model's loss equals the base model's bitwise", mismatches(s),
                    tol::kBitwiseMismatches));
  }
  // The controls are the adapter init's switch that draws B from normal(0, std).
  auto with_b = [&](float std) {
    StepConfig c = cfg;
    c.adapters.fault_b_init_std = std;
    return c;
  };
  {
    TrainStep s(dev, with_b(0.05f));
    emit(make_negative_control("LR-1", "B drawn normal(0, 0.05) instead of zero", mismatches(s), tol::kBitwiseMismatches, check_name("LR-1", "LoRA with B = 0: the adapted model's loss equals the base model's bitwise")));
  }
  {
    TrainStep s(dev, with_b(tol::kLoraSubtleBStd));
    emit(make_subtle_control("LR-1", fmt::format("B drawn normal(0, {:g}) instead of zero", tol::kLoraSubtleBStd),
                             mismatches(s), tol::kBitwiseMismatches, check_name("LR-1", "LoRA with B = 0: the adapted model's loss equals the base model's bitwise")));
  }
  return out;
}

// LR-2: the base model with its adapted weights merged (merge_lora: W + (alpha/r) B A,
// computed in double, rounded once to fp32) against the adapter path with the same A
// and B: every logit of the batch, as one tensor. The controls are the merge's own
// switches: B A scaled by alpha instead of alpha / r (gross), and by (alpha / r)(1 +
// kLoraMergeSubtleOffset) (subtle; a fixed offset, the measured shift in tolerances.hpp).
std::vector<Measurement> lr2_merged(RunContext& ctx) {
  std::vector<Measurement> out;
  Device& dev = ctx.device;
  const StepConfig base_cfg = lora_config(false), cfg = lora_config(true);
  const Batch batch = make_lm_batch(dev, cfg.transformer, cfg.batch, cfg.seq_len, ctx.seed);
  TrainStep adapted(dev, cfg);
  set_b(adapted, ctx.seed, tol::kLoraMergeBStd);
  const std::vector<float> path = adapted.logits(batch);
  auto merged_error = [&](const AdapterConfig& a) {
    TrainStep base(dev, base_cfg);
    HR_CHECK(merge_lora(adapted.params(), a, base.params()) == 2 * cfg.transformer.layers,
             "LR-2: merged other than the q and v projections of every layer");
    return rel_l2(base.logits(batch), path);
  };
  const std::string title = "merged W + (alpha/r) B A gives the adapter path's logits (fp32)";
  auto emit = [&](Measurement m, const char* fault) {
    describe(m, dev, cfg, "logits_rel_l2");
    m.tolerance_reason = tol::kLoraMergedReason;
    m.details["logits"] = path.size();
    if (*fault) m.config["fault"] = fault;
    out.push_back(std::move(m));
  };
  emit(make_check("LR-2", title, merged_error(cfg.adapters), tol::kLoraMergedRel), "");
  AdapterConfig alpha = cfg.adapters, offset = cfg.adapters;
  alpha.fault_merge_scale_alpha = true;
  offset.fault_merge_scale_offset = tol::kLoraMergeSubtleOffset;
  emit(make_negative_control("LR-2", "merged with scale alpha instead of alpha/r", merged_error(alpha),
                             tol::kLoraMergedRel, check_name("LR-2", title)),
       "merge_scale_alpha");
  emit(make_subtle_control("LR-2",
                           fmt::format("merged with the scale {:g} too large", tol::kLoraMergeSubtleOffset),
                           merged_error(offset), tol::kLoraMergedRel, check_name("LR-2", title)),
       "merge_scale_offset");
  return out;
}

// LR-4: gradient and optimizer-state bytes of a LoRA step (tracker, after one step):
// only the adapters r (in + out) per adapted matrix, 4 and 8 (AdamW) bytes each.
// Error in parameters: |extra gradient bytes| / 4 + |extra state bytes| / 8.
constexpr const char* kLr4UnchangedTitle = "the frozen base is bitwise unchanged after AdamW steps on the adapters";
constexpr int kLoraFrozenSteps = 3;
constexpr const char* kLoraSubtleMovingWeight = "h.0.attn.q.weight";

std::vector<Measurement> lr4_frozen(RunContext& ctx) {
  std::vector<Measurement> out;
  Device& dev = ctx.device;
  const StepConfig cfg = lora_config(true);
  const Batch batch = make_lm_batch(dev, cfg.transformer, cfg.batch, cfg.seq_len, ctx.seed);
  const double adapter_params =
      static_cast<double>(cfg.transformer.layers * 2 * kLoraRank * (2 * cfg.transformer.d_model));
  enum class Variant { lora, full, ln_grad_kept };
  auto error_of = [&](Variant v, nlohmann::json& d) {
    const MemorySnapshot before = dev.memory().snapshot();
    // The parameter set's switches: every base parameter left trainable (full
    // fine-tuning), one frozen LayerNorm bias that still owns a gradient buffer.
    StepConfig c = cfg;
    if (v == Variant::full) c.adapters.fault_not_frozen = "*";
    if (v == Variant::ln_grad_kept) c.adapters.fault_grad_kept = "ln_f.bias";
    TrainStep step(dev, c);
    step.step(batch);
    const MemorySnapshot after = dev.memory().snapshot();
    const double grad_bytes = static_cast<double>(after.current(Consumer::gradients)) -
                              static_cast<double>(before.current(Consumer::gradients));
    const double state_bytes = static_cast<double>(after.current(Consumer::optimizer_state)) -
                               static_cast<double>(before.current(Consumer::optimizer_state));
    d = {{"gradient_bytes", grad_bytes},
         {"optimizer_state_bytes", state_bytes},
         {"expected_gradient_bytes", 4 * adapter_params},
         {"expected_optimizer_state_bytes", 8 * adapter_params}};
    return std::fabs(grad_bytes - 4 * adapter_params) / 4 + std::fabs(state_bytes - 8 * adapter_params) / 8;
  };
  auto emit = [&](Measurement m, nlohmann::json d) {
    describe(m, dev, cfg, "parameters_with_gradient_or_state_beyond_the_adapters");
    m.details = std::move(d);
    out.push_back(std::move(m));
  };
  nlohmann::json d;
  double e = error_of(Variant::lora, d);
  emit(make_check("LR-4", "frozen base: gradient and AdamW state bytes only for the adapters (tracker)", e, tol::kBitwiseMismatches), d);
  e = error_of(Variant::full, d);
  emit(make_negative_control("LR-4", "every base parameter left trainable (full fine-tuning) is flagged by the bytes", e, tol::kBitwiseMismatches, check_name("LR-4", "frozen base: gradient and AdamW state bytes only for the adapters (tracker)")), d);
  e = error_of(Variant::ln_grad_kept, d);
  emit(make_subtle_control("LR-4", "one frozen LayerNorm bias keeps its gradient buffer", e, tol::kBitwiseMismatches, check_name("LR-4", "frozen base: gradient and AdamW state bytes only for the adapters (tracker)")), d);

  // The frozen base after a few AdamW steps: bitwise what it was, tensor by tensor.
  // The controls are the parameter set's switch that leaves base parameters
  // trainable: all of them (gross), one attention weight (subtle).
  auto base_moved = [&](const std::string& fault, nlohmann::json& details) {
    StepConfig c = cfg;
    c.adapters.fault_not_frozen = fault;
    TrainStep step(dev, c);
    std::vector<std::pair<std::string, std::vector<float>>> before;
    for (const Param& p : step.params().all())
      if (p.name.find("lora_") == std::string::npos) before.emplace_back(p.name, p.master.to_host_f32());
    for (int i = 0; i < kLoraFrozenSteps; ++i) step.step(batch);
    nlohmann::json moved = nlohmann::json::array();
    for (const auto& [name, v] : before) {
      const std::vector<float> now = step.params().at(name).master.to_host_f32();
      if (now.size() != v.size() || std::memcmp(now.data(), v.data(), v.size() * sizeof(float)) != 0)
        moved.push_back(name);
    }
    details = {{"base_tensors", before.size()}, {"moved", moved}, {"steps", kLoraFrozenSteps}};
    if (!fault.empty()) details["fault"] = fmt::format("adapters.fault_not_frozen = '{}'", fault);
    return static_cast<double>(moved.size());
  };
  const std::string frozen_check = check_name("LR-4", kLr4UnchangedTitle);
  auto emit_moved = [&](Measurement m, nlohmann::json d) {
    describe(m, dev, cfg, "frozen base tensors changed (bitwise)");
    m.tolerance_reason = tol::kBitwiseMismatchesReason;
    m.details = std::move(d);
    m.config["steps"] = kLoraFrozenSteps;
    out.push_back(std::move(m));
  };
  e = base_moved("", d);
  emit_moved(make_check("LR-4", kLr4UnchangedTitle, e, tol::kBitwiseMismatches), d);
  e = base_moved("*", d);
  emit_moved(make_negative_control("LR-4", "every base parameter left trainable is flagged", e, tol::kBitwiseMismatches,
                                   frozen_check),
             d);
  e = base_moved(kLoraSubtleMovingWeight, d);
  emit_moved(make_subtle_control("LR-4", fmt::format("one base weight ({}) left trainable is flagged",
                                                     kLoraSubtleMovingWeight),
                                 e, tol::kBitwiseMismatches, frozen_check),
             d);
  return out;
}

}  // namespace

HR_REGISTER_PROPERTY(PropertySpec{"LR-1", "LoRA at initialisation (B = 0) leaves the model's output unchanged", 0.2,
                                  lr1_identity, ""});
HR_REGISTER_PROPERTY(PropertySpec{"LR-2", "LoRA merged weights give the adapter path's output", 0.3, lr2_merged, ""});
HR_REGISTER_PROPERTY(PropertySpec{"LR-4", "LoRA's frozen base owns no gradient and no optimizer state", 0.2,
                                  lr4_frozen, ""});

}  // namespace hr::props
