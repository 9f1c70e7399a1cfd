// BM-OPT: fp32 AdamW against 8-bit AdamW (block 256 and 2048) on the model of BM-MB:
// the optimizer step's time alone (gradients from one real step, then the update
// timed), the bytes it moves and their rate, and the state's bytes per consumer, so
// the memory saved and its cost in step time are read side by side.
#include <fmt/format.h>

#include <algorithm>

#include "harness/check.hpp"
#include "harness/data/synthetic.hpp"
#include "harness/properties/microbatch_sweep.hpp"
#include "harness/properties/sweep_support.hpp"
#include "harness/step/train_step.hpp"

namespace hr::props {
namespace {

SweepPoint measure_optimizer_point(Device& dev, StepConfig cfg, OptimizerKind kind, int64_t block, uint64_t seed,
                                   const TimingOptions& timing) {
  cfg.optimizer.kind = kind;
  cfg.optimizer.adamw8bit.block_size = block;
  SweepPoint p = sweep_point(
      "BM-OPT", dev, cfg.precision.compute, model_kind_name(cfg.model),
      {{"optimizer", optimizer_kind_name(kind)},
       {"block_size", kind == OptimizerKind::adamw8bit ? nlohmann::json(block) : nlohmann::json(nullptr)},
       {"d_model", cfg.transformer.d_model},
       {"layers", cfg.transformer.layers},
       {"vocab", cfg.transformer.vocab}});
  measure_point(p, [&] {
    TrainStep step(dev, cfg);
    const Batch batch = make_lm_batch(dev, cfg.transformer, cfg.batch, cfg.seq_len, seed);
    step.step(batch);  // gradients, and the state's first touch, out of the timed region
    int64_t t = 1;
    time_point(dev, p, timing, [&] { step.optimizer().step(step.params(), ++t); });
    const double params = static_cast<double>(step.params().trainable_numel());
    const double state = static_cast<double>(step.optimizer().state_bytes());
    p.metrics["optimizer_step_s"] = p.time->median_s;
    p.metrics["state_bytes"] = state;
    p.metrics["state_bytes_per_parameter"] = state / params;
    p.metrics["parameters"] = params;
    // What the step reads and writes, as bench_optim8bit counts it: each trainable
    // parameter read and written, its gradient read, every state tensor (codes,
    // absmax, fp32 moments) read and written. Its rate over the card's memory
    // bandwidth is the fraction of it the step reaches.
    double moved = 2.0 * state;
    for (const Param& prm : step.params().all())
      if (prm.trainable) moved += 2.0 * static_cast<double>(prm.master.nbytes()) + static_cast<double>(prm.grad.nbytes());
    p.metrics["bytes_moved"] = moved;
    p.metrics["bytes_per_s"] = moved / p.time->median_s;
  });
  return p;
}

std::vector<SweepPoint> run_optimizer_sweep(RunContext& ctx) {
  const MicroBatchSweep base = microbatch_sweep_config(ctx.preset, ctx.device.kind());
  StepConfig cfg = base.base;
  // The optimizer step does not depend on the micro-batch: the smallest keeps the
  // gradient step that precedes the timing light on memory.
  cfg.micro_batch = *std::min_element(base.micro_batches.begin(), base.micro_batches.end());
  std::vector<SweepPoint> points;
  points.push_back(measure_optimizer_point(ctx.device, cfg, OptimizerKind::adamw, 0, ctx.seed, base.timing));
  for (const int64_t block : {q8::kDefaultBlock, q8::kLargeBlock})
    points.push_back(measure_optimizer_point(ctx.device, cfg, OptimizerKind::adamw8bit, block, ctx.seed, base.timing));
  const SweepPoint& ref = points.front();
  for (SweepPoint& p : points) {
    if (p.status != "ok" || ref.status != "ok") continue;
    p.metrics["step_time_vs_fp32"] = p.metrics["optimizer_step_s"].get<double>() / ref.metrics["optimizer_step_s"].get<double>();
    p.metrics["state_bytes_vs_fp32"] = p.metrics["state_bytes"].get<double>() / ref.metrics["state_bytes"].get<double>();
  }
  return points;
}

HR_REGISTER_SWEEP(SweepSpec{"BM-OPT", "fp32 AdamW against 8-bit AdamW: optimizer step time and state bytes", 2.0,
                            run_optimizer_sweep, {}, ""});

}  // namespace
}  // namespace hr::props
