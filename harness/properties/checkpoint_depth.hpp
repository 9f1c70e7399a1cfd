// CK-3: peak memory against depth under activation checkpointing, as a sweep
// (points per depth and schedule, for the report's depth curve) and a property
// (the fitted log-log exponents against their bounds, with controls).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "harness/registry.hpp"
#include "harness/step/step_config.hpp"
#include "harness/timing.hpp"

namespace hr::props {

// The schedules CK-3 compares: none, segments of ceil(sqrt L), every block, and
// segments of ceil(L / 4) (four segments: the subtle control's schedule).
enum class DepthSchedule { none, sqrt_l, every_block, quarter_l };
const char* depth_schedule_name(DepthSchedule s);
int64_t depth_schedule_k(DepthSchedule s, int64_t depth);

// Depths L: {4, 8, 16, 32} (quick), {4, 8, 16, 32, 64} (full).
std::vector<int64_t> ck3_depths(Preset preset);
StepConfig ck3_config(DType dtype, Preset preset, int64_t depth);

// One forward + backward at (depth, schedule): peaks of the activations and of
// everything allocated during the pass (workspace included), on the tracker.
// `faults` carries CheckpointPolicy's fault switches for the controls (its
// every_k_blocks is ignored: the schedule sets it).
SweepPoint measure_depth_point(Device& dev, DType dtype, Preset preset, int64_t depth, DepthSchedule s, uint64_t seed,
                               const CheckpointPolicy& faults = {});
std::vector<SweepPoint> ck3_depth_sweep(Device& dev, DType dtype, Preset preset, uint64_t seed);
std::vector<Measurement> ck3_depth_exponents(Device& dev, DType dtype, Preset preset, uint64_t seed);

}  // namespace hr::props

namespace hr::props {

// BM-CK: one training step per checkpoint granularity (none, every block, every 2
// blocks, ceil(sqrt L) blocks): step time, its ratio to no checkpointing, peak
// activation and total bytes. Registered as a sweep of `headroom run` and as
// Google Benchmark cases (suites/bench/bench_checkpoint.cpp).
struct CheckpointBench {
  StepConfig base;  // every_k_blocks varies
  std::vector<std::pair<std::string, int64_t>> granularities;  // name, every_k_blocks
  TimingOptions timing;
};
CheckpointBench checkpoint_bench_config(Preset preset, BackendKind backend);
CheckpointBench checkpoint_bench_smoke_config();  // tiny, for ctest
SweepPoint measure_checkpoint_point(Device& dev, const CheckpointBench& b, const std::string& granularity,
                                    int64_t every_k, uint64_t seed);
// Every granularity; points carry overhead_ratio = step time / the plain step's.
std::vector<SweepPoint> run_checkpoint_bench(Device& dev, const CheckpointBench& b, uint64_t seed);

}  // namespace hr::props
