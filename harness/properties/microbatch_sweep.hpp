// BM-MB: the micro-batch sweep at a fixed effective batch on the transformer.
// Each point is one configuration {micro_batch, accum_steps} of one attention form
// (naive; on a GPU also memory-efficient on named kernels): the training step's
// time (median and spread), peak bytes per consumer over the timed steps, tokens/s
// and per-sample throughput relative to the largest micro-batch. The same
// functions back the registered sweep (`headroom run`, the report's throughput /
// bytes against micro-batch curve) and the Google Benchmark cases.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "harness/properties/sweep_support.hpp"
#include "harness/registry.hpp"
#include "harness/step/step_config.hpp"
#include "harness/timing.hpp"
#include "kernels/attention/attention.hpp"

namespace hr::props {

// One way the step runs attention. Naive is the reference form, the one every
// backend times. On a GPU in 16 bits the memory-efficient form is timed too, on
// named kernels: people train with fused attention, and a step timed only on
// naive attention makes the micro-batch trade-off (and the step's MFU) read as it
// would on no real training run.
struct MicroBatchAttention {
  bool memory_efficient = false;
  std::optional<ops::GpuAttentionKernel> kernel;  // set for a GPU's memory-efficient form only
  bool operator==(const MicroBatchAttention& o) const {
    return memory_efficient == o.memory_efficient && kernel == o.kernel;
  }
};

struct MicroBatchSweep {
  StepConfig base;                    // batch = the effective batch; micro_batch set per point
  std::vector<int64_t> micro_batches; // largest first: the reference for relative throughput
  TimingOptions timing;
  // Each form sweeps every micro-batch, its relative throughputs against its own
  // largest micro-batch. microbatch_sweep_config gives naive alone;
  // microbatch_attention_forms says what a device adds.
  std::vector<MicroBatchAttention> attention = {MicroBatchAttention{}};
};

// The forms BM-MB times: naive; on CUDA in 16 bits, also the memory-efficient form
// on the run's kernels (`run_kernel`), and on cuDNN's fused attention where it is
// available and not the run's already (the fastest kernel the device has, timed
// beside the own ones, which stay the reference).
std::vector<MicroBatchAttention> microbatch_attention_forms(BackendKind backend, DType compute,
                                                            ops::GpuAttentionKernel run_kernel, bool cudnn_available);
// The same for `dev` and `cfg`: asks the device whether the run's kernels and
// cuDNN's take the model's head dimension and dtype (run's kernels that do not are
// named scalar, the kernels that then run).
std::vector<MicroBatchAttention> microbatch_attention_forms(Device& dev, const StepConfig& cfg);

// quick: a transformer a 2-core CPU steps in ~0.1 s; full: the full preset's
// transformer (sized for one H200). fp32 on the CPU, bf16 on a GPU. Effective batch 32.
MicroBatchSweep microbatch_sweep_config(Preset preset, BackendKind backend);
// A tiny configuration for smoke runs (benchmarks under ctest).
MicroBatchSweep microbatch_sweep_smoke_config();

// One point: builds the step, runs one warm-up step, then times steps through
// time_point (sweep_support.hpp): peaks of the timed steps, one BLAS thread on the
// CPU, the settings recorded. Out of memory gives status "out_of_memory".
// `kernel`: the GPU attention kernels of a memory-efficient point, set for the
// point and recorded in its config ("attention_kernel").
SweepPoint measure_microbatch_point(Device& dev, const StepConfig& cfg, uint64_t seed, const TimingOptions& timing,
                                    std::optional<ops::GpuAttentionKernel> kernel = std::nullopt);

// Every point of every attention form, then each point's
// "relative_per_sample_throughput" (its samples/s over the largest micro-batch's
// of the same form).
std::vector<SweepPoint> run_microbatch_sweep(Device& dev, const MicroBatchSweep& sweep, uint64_t seed);

// One recorded point measured again (the sweep's remeasure hook, for `headroom
// validate`): the preset's configuration at the point's micro-batch; nullopt when
// the point is not one this preset and device would run.
std::optional<SweepPoint> remeasure_microbatch_point(RunContext& ctx, const SweepPoint& point);

}  // namespace hr::props
