// BM-CK as Google Benchmark cases: one training step of the transformer per
// checkpoint granularity (none, every block, every 2 blocks, ceil(sqrt L) blocks).
// Counters: step time, overhead against no checkpointing (from the "none" case run
// first in this process), peak activation and total bytes, block forwards per block
// and step (counted inside the blocks). "checkpoint/cpu_smoke" is a tiny variant
// for ctest; `headroom run` records the same points as sweep BM-CK.
//   bench_checkpoint --benchmark_out=ck.json --benchmark_out_format=json
#include <benchmark/benchmark.h>

#include <map>
#include <memory>
#include <string>

#include "harness/device.hpp"
#include "harness/properties/checkpoint_depth.hpp"
#include "suites/bench/bench_support.hpp"

namespace {

// Step seconds of the plain ("none") case per benchmark name.
std::map<std::string, double>& plain_seen() {
  static std::map<std::string, double> m;
  return m;
}

void run_case(benchmark::State& state, hr::BackendKind kind, const hr::props::CheckpointBench& bench,
              const std::string& case_name) {
  std::string why_not;
  hr::Device* dev = hr::bench::device_for(kind, &why_not);
  if (dev == nullptr) {
    state.SkipWithError(why_not.c_str());
    return;
  }
  const auto& [granularity, every_k] = bench.granularities[static_cast<size_t>(state.range(0))];
  hr::props::CheckpointBench b = bench;
  // Google Benchmark decides the repetitions: one measured point per iteration batch.
  b.timing.min_reps = 1;
  b.timing.max_reps = 1;
  b.timing.warmup = 0;
  b.timing.min_total_s = 0;
  double total_s = 0;
  hr::SweepPoint last;
  for (auto _ : state) {
    last = hr::props::measure_checkpoint_point(*dev, b, granularity, every_k, 1234);
    if (last.status != "ok") {
      state.SkipWithError(last.reason.c_str());
      return;
    }
    state.SetIterationTime(last.time->median_s);
    total_s += last.time->median_s;
  }
  const double step_s = total_s / static_cast<double>(state.iterations());
  using benchmark::Counter;
  // The kernels the point timed (time_region's kernel_calls), as the report names them.
  const std::string attention = hr::attention_kernels_label(last);
  state.SetLabel(attention.empty() ? granularity : granularity + ", attention " + attention);
  state.counters["every_k_blocks"] = static_cast<double>(every_k);
  state.counters["step_s"] = step_s;
  if (every_k == 0) plain_seen()[case_name] = step_s;
  if (plain_seen().count(case_name)) state.counters["overhead_ratio"] = step_s / plain_seen()[case_name];
  for (const char* key : {"activation_peak_bytes", "total_peak_bytes", "pass_peak_bytes"})
    state.counters[key] = Counter(last.metrics[key].get<double>(), Counter::kDefaults, Counter::OneK::kIs1024);
  state.counters["block_forwards_per_block_step"] = last.metrics["block_forwards_per_block_step"].get<double>();
}

void register_bench(const std::string& name, hr::BackendKind kind, const hr::props::CheckpointBench& bench) {
  auto* b = hr::bench::register_case(name, [kind, bench, name](benchmark::State& s) {
    run_case(s, kind, bench, name);
  });
  b->ArgName("granularity")->UseManualTime()->Unit(benchmark::kMillisecond);
  for (size_t i = 0; i < bench.granularities.size(); ++i) b->Arg(static_cast<int64_t>(i));  // "none" first
}

[[maybe_unused]] const bool registered = [] {
  register_bench("checkpoint/cpu", hr::BackendKind::cpu,
                 hr::props::checkpoint_bench_config(hr::Preset::quick, hr::BackendKind::cpu));
  register_bench("checkpoint/cpu_smoke", hr::BackendKind::cpu, hr::props::checkpoint_bench_smoke_config());
  register_bench("checkpoint/cuda", hr::BackendKind::cuda,
                 hr::props::checkpoint_bench_config(hr::Preset::full, hr::BackendKind::cuda));
  return true;
}();

}  // namespace

BENCHMARK_MAIN();
