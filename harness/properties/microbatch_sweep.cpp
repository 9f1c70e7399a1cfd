// BM-MB (docs/catalogue.md): what accumulation costs in time. The arithmetic per
// sample is unchanged, but small micro-batches use the device less efficiently
// (small matrix products, per-step overheads no longer amortised); the field
// guide (section 02) says 8 -> 4 is often nearly free and 1 can be much worse.
// This measures it on the device at hand, with bytes per consumer beside it.
#include "harness/properties/microbatch_sweep.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <optional>
#include <string>

#include "harness/check.hpp"
#include "harness/data/synthetic.hpp"
#include "harness/models/presets.hpp"
#include "harness/properties/accum_support.hpp"
#include "harness/step/train_step.hpp"

namespace hr::props {

MicroBatchSweep microbatch_sweep_config(Preset preset, BackendKind backend) {
  MicroBatchSweep s;
  StepConfig& c = s.base;
  c.model = ModelKind::transformer;
  if (preset == Preset::quick) {
    c.transformer.vocab = 256;
    c.transformer.max_positions = 64;
    c.transformer.d_model = 64;
    c.transformer.heads = 4;
    c.transformer.layers = 2;
    c.seq_len = 64;
    // At least 10 timed steps a point: a comparison's rank test over 10 against 10
    // samples can reach p ~ 2e-4, so a real change is decidable; fewer (3) never
    // reach 0.01. ~1.5 s a point on an idle 2-core CPU.
    s.timing.warmup = 1;
    s.timing.min_reps = 10;
    s.timing.max_reps = 30;
    s.timing.min_total_s = 0.5;
  } else {
    const TransformerPreset p = transformer_preset(Preset::full);
    c.transformer = p.model;
    c.seq_len = p.seq_len;
  }
  c.transformer.dropout = 0.f;
  c.batch = kEffectiveBatch;
  c.micro_batch = kEffectiveBatch;
  c.precision.compute = backend == BackendKind::cuda ? DType::bf16 : DType::f32;
  c.optimizer.kind = OptimizerKind::adamw;
  s.micro_batches = accum_micro_batches();
  std::sort(s.micro_batches.rbegin(), s.micro_batches.rend());
  return s;
}

MicroBatchSweep microbatch_sweep_smoke_config() {
  MicroBatchSweep s = microbatch_sweep_config(Preset::quick, BackendKind::cpu);
  StepConfig& c = s.base;
  c.transformer.vocab = 32;
  c.transformer.max_positions = 8;
  c.transformer.d_model = 16;
  c.transformer.heads = 2;
  c.transformer.layers = 1;
  c.seq_len = 8;
  c.batch = 8;
  c.micro_batch = 8;
  s.micro_batches = {8, 1};
  s.timing.warmup = 0;
  s.timing.min_reps = 1;
  s.timing.max_reps = 2;
  s.timing.min_total_s = 0;
  return s;
}

std::vector<MicroBatchAttention> microbatch_attention_forms(BackendKind backend, DType compute,
                                                            ops::GpuAttentionKernel run_kernel, bool cudnn_available) {
  std::vector<MicroBatchAttention> forms = {MicroBatchAttention{}};
  if (backend != BackendKind::cuda || compute == DType::f32) return forms;  // fp32 takes the scalar form alone
  forms.push_back({true, run_kernel});
  if (cudnn_available && run_kernel != ops::GpuAttentionKernel::cudnn)
    forms.push_back({true, ops::GpuAttentionKernel::cudnn});
  return forms;
}

std::vector<MicroBatchAttention> microbatch_attention_forms(Device& dev, const StepConfig& cfg) {
  ops::GpuAttentionKernel run = ops::gpu_attention_kernel();
  bool cudnn = false;
  if (dev.is_cuda() && cfg.model == ModelKind::transformer && cfg.precision.compute != DType::f32) {
    const int64_t D = cfg.transformer.head_dim();
    // Kernels that cannot take this head dim or dtype fall back to the scalar ones call
    // by call: the form is named after what runs.
    if (!ops::gpu_attention_kernel_available(dev, run, cfg.precision.compute, D)) run = ops::GpuAttentionKernel::scalar;
    cudnn = ops::gpu_attention_kernel_available(dev, ops::GpuAttentionKernel::cudnn, cfg.precision.compute, D);
  }
  return microbatch_attention_forms(dev.kind(), cfg.precision.compute, run, cudnn);
}

SweepPoint measure_microbatch_point(Device& dev, const StepConfig& cfg, uint64_t seed, const TimingOptions& timing,
                                    std::optional<ops::GpuAttentionKernel> kernel) {
  HR_CHECK(!kernel || cfg.transformer.memory_efficient_attention,
           "BM-MB: attention kernels are named for the memory-efficient form only");
  nlohmann::json config = {{"micro_batch", cfg.micro_batch},
                           {"accum_steps", cfg.accum_steps()},
                           {"effective_batch", cfg.batch},
                           {"seq_len", cfg.seq_len},
                           {"d_model", cfg.transformer.d_model},
                           {"layers", cfg.transformer.layers},
                           // The rest of the model, so that a peer (ci/peer/torch_step.py)
                           // can build the same one from the point alone.
                           {"vocab", cfg.transformer.vocab},
                           {"heads", cfg.transformer.heads},
                           {"max_positions", cfg.transformer.max_positions},
                           {"mlp_ratio", cfg.transformer.mlp_ratio},
                           {"dropout", cfg.transformer.dropout},
                           {"attention", cfg.transformer.memory_efficient_attention ? "memory_efficient" : "naive"},
                           {"optimizer", optimizer_kind_name(cfg.optimizer.kind)}};
  if (kernel) config["attention_kernel"] = ops::gpu_attention_kernel_name(*kernel);
  SweepPoint p = sweep_point("BM-MB", dev, cfg.precision.compute, model_kind_name(cfg.model), std::move(config));
  // The point's kernels for its whole measurement, put back after it (a throw included).
  std::optional<ops::ScopedGpuAttentionKernel> scope;
  if (kernel) scope.emplace(*kernel);
  measure_point(p, [&] {
    TrainStep step(dev, cfg);
    const Batch batch = make_lm_batch(dev, cfg.transformer, cfg.batch, cfg.seq_len, seed);
    // The warm-up step (first-touch allocations and optimizer state out of the timed
    // region) also counts how often one step makes the host wait for the device
    // (Device::host_syncs): the same at every micro-batch size, or the smaller ones
    // pay for it in the timing.
    const size_t syncs_before = dev.host_syncs();
    step.step(batch);
    p.metrics["host_syncs_per_step"] = static_cast<double>(dev.host_syncs() - syncs_before);
    time_point(dev, p, timing, [&] { step.step(batch); });
    const double tokens = static_cast<double>(cfg.batch * cfg.seq_len);
    p.metrics["tokens_per_step"] = tokens;
    p.metrics["step_time_s"] = p.time->median_s;
    p.metrics["tokens_per_s"] = tokens / p.time->median_s;
    p.metrics["samples_per_s"] = static_cast<double>(cfg.batch) / p.time->median_s;
    if (cfg.model == ModelKind::transformer) {  // MFU = model_tflops_per_s / the card's peak
      const double per_token = model_flops_per_token(cfg.transformer, cfg.seq_len);
      p.metrics["model_flops_per_token"] = per_token;
      p.metrics["model_tflops_per_s"] = per_token * tokens / p.time->median_s / 1e12;
    }
  });
  return p;
}

std::vector<SweepPoint> run_microbatch_sweep(Device& dev, const MicroBatchSweep& sweep, uint64_t seed) {
  std::vector<SweepPoint> points;
  for (const MicroBatchAttention& form : sweep.attention) {
    const size_t first = points.size();
    double reference = 0;  // samples/s at the form's largest micro-batch that ran
    int64_t reference_mb = 0;
    for (int64_t mb : sweep.micro_batches) {
      StepConfig cfg = sweep.base;
      cfg.micro_batch = mb;
      cfg.transformer.memory_efficient_attention = form.memory_efficient;
      points.push_back(measure_microbatch_point(dev, cfg, seed, sweep.timing, form.kernel));
      const SweepPoint& p = points.back();
      if (p.status == "ok" && mb > reference_mb) {
        reference = p.metrics["samples_per_s"].get<double>();
        reference_mb = mb;
      }
    }
    for (size_t i = first; i < points.size(); ++i) {
      SweepPoint& p = points[i];
      if (p.status != "ok" || reference <= 0) continue;
      p.metrics["relative_per_sample_throughput"] = p.metrics["samples_per_s"].get<double>() / reference;
      p.metrics["reference_micro_batch"] = reference_mb;
    }
  }
  return points;
}

std::optional<SweepPoint> remeasure_microbatch_point(RunContext& ctx, const SweepPoint& point) {
  const MicroBatchSweep sweep = microbatch_sweep_config(ctx.preset, ctx.device.kind());
  auto it = point.config.find("micro_batch");
  if (point.sweep != "BM-MB" || it == point.config.end() || !it->is_number_integer()) return std::nullopt;
  StepConfig cfg = sweep.base;
  cfg.micro_batch = it->get<int64_t>();
  if (std::find(sweep.micro_batches.begin(), sweep.micro_batches.end(), cfg.micro_batch) == sweep.micro_batches.end())
    return std::nullopt;
  // The point's attention form, if this device times it.
  MicroBatchAttention form;
  const auto a = point.config.find("attention");
  form.memory_efficient = a != point.config.end() && a->is_string() && *a == "memory_efficient";
  if (const auto k = point.config.find("attention_kernel"); k != point.config.end()) {
    if (!k->is_string()) return std::nullopt;
    form.kernel = ops::parse_gpu_attention_kernel(k->get<std::string>());
    if (!form.kernel) return std::nullopt;
  }
  const std::vector<MicroBatchAttention> forms = microbatch_attention_forms(ctx.device, cfg);
  if (std::find(forms.begin(), forms.end(), form) == forms.end()) return std::nullopt;
  cfg.transformer.memory_efficient_attention = form.memory_efficient;
  SweepPoint again = measure_microbatch_point(ctx.device, cfg, ctx.seed, sweep.timing, form.kernel);
  // Only the very configuration recorded: another preset or backend is another point.
  if (again.config != point.config || again.dtype != point.dtype || again.model != point.model) return std::nullopt;
  return again;
}

namespace {

HR_REGISTER_SWEEP(SweepSpec{"BM-MB", "micro-batch sweep at a fixed effective batch: throughput and bytes per consumer",
                            3.0,
                            [](RunContext& ctx) {
                              MicroBatchSweep sweep = microbatch_sweep_config(ctx.preset, ctx.device.kind());
                              sweep.attention = microbatch_attention_forms(ctx.device, sweep.base);
                              return run_microbatch_sweep(ctx.device, sweep, ctx.seed);
                            },
                            remeasure_microbatch_point, ""});

}  // namespace
}  // namespace hr::props
