// BM-LR (LR-5): full fine-tuning against LoRA on one transformer: bytes per
// consumer (the report's memory bars, labelled by config.technique) and step time.
// LoRA leaves the activations and the weights as they are; gradients and optimizer
// state shrink to the adapters'.
#include <fmt/format.h>

#include <string>
#include <vector>

#include "harness/check.hpp"
#include "harness/data/synthetic.hpp"
#include "harness/properties/sweep_support.hpp"
#include "harness/registry.hpp"
#include "harness/step/train_step.hpp"
#include "harness/timing.hpp"

namespace hr::props {
namespace {

SweepPoint measure_lora_point(Device& dev, const StepConfig& cfg, uint64_t seed) {
  const bool lora = cfg.adapters.kind == AdapterKind::lora;
  SweepPoint p =
      sweep_point("BM-LR", dev, cfg.precision.compute, model_kind_name(cfg.model),
                  {{"technique", lora ? fmt::format("LoRA r{} (q, v)", cfg.adapters.rank) : "full fine-tuning"},
                   {"lora_rank", lora ? cfg.adapters.rank : 0},
                   {"d_model", cfg.transformer.d_model},
                   {"layers", cfg.transformer.layers},
                   {"seq_len", cfg.seq_len},
                   {"batch", cfg.batch},
                   {"optimizer", optimizer_kind_name(cfg.optimizer.kind)}});
  measure_point(p, [&] {
    TrainStep step(dev, cfg);
    const Batch batch = make_lm_batch(dev, cfg.transformer, cfg.batch, cfg.seq_len, seed);
    step.step(batch);  // optimizer state and first-touch allocations out of the timed region
    time_point(dev, p, TimingOptions{}, [&] { step.step(batch); });
    p.metrics["step_time_s"] = p.time->median_s;
    p.metrics["tokens_per_s"] = static_cast<double>(cfg.batch * cfg.seq_len) / p.time->median_s;
    p.metrics["trainable_parameters"] = static_cast<double>(step.params().trainable_numel());
    p.metrics["parameters"] = static_cast<double>(step.params().numel());
  });
  return p;
}

std::vector<SweepPoint> run_lora_sweep(RunContext& ctx) {
  const bool full = ctx.preset == Preset::full;
  StepConfig t;
  t.model = ModelKind::transformer;
  t.transformer.vocab = full ? 8192 : 128;
  t.transformer.max_positions = full ? 1024 : 128;
  t.transformer.d_model = full ? 512 : 64;
  t.transformer.heads = full ? 8 : 4;
  t.transformer.layers = 2;
  t.seq_len = full ? 256 : 32;
  t.batch = full ? 4 : 4;
  t.micro_batch = t.batch;
  t.optimizer.kind = OptimizerKind::adamw;
  std::vector<SweepPoint> points;
  points.push_back(measure_lora_point(ctx.device, t, ctx.seed));
  for (int64_t r : {4, 16}) {
    StepConfig c = t;
    c.adapters.kind = AdapterKind::lora, c.adapters.rank = r, c.adapters.alpha = 2.f * static_cast<float>(r);
    points.push_back(measure_lora_point(ctx.device, c, ctx.seed));
  }
  return points;
}

HR_REGISTER_SWEEP(SweepSpec{"BM-LR", "full fine-tuning against LoRA: bytes per consumer and step time", 1.0,
                            run_lora_sweep, {}, ""});

}  // namespace
}  // namespace hr::props
