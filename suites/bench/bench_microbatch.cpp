// BM-MB as Google Benchmark cases: one training step of the transformer at a
// fixed effective batch, per micro-batch size (largest first, so later cases can
// report their per-sample throughput relative to it). Counters: tokens/s,
// samples/s, step time, peak bytes per consumer over the timed steps (the
// Device's MemoryTracker). Device-timed (manual time), so the numbers mean the
// same on the GPU. "microbatch/cpu_smoke" is a tiny variant for ctest.
//   bench_microbatch --benchmark_out=mb.json --benchmark_out_format=json
#include <benchmark/benchmark.h>

#include <map>
#include <memory>
#include <string>

#include "harness/check.hpp"
#include "harness/data/synthetic.hpp"
#include "harness/device.hpp"
#include "harness/properties/microbatch_sweep.hpp"
#include "harness/step/train_step.hpp"
#include "suites/bench/bench_support.hpp"

namespace {

// samples/s per (case name, micro-batch), for the relative-throughput counter.
std::map<std::string, std::map<int64_t, double>>& throughput_seen() {
  static std::map<std::string, std::map<int64_t, double>> m;
  return m;
}

void run_case(benchmark::State& state, hr::BackendKind kind, const hr::props::MicroBatchSweep& sweep,
              const std::string& case_name) {
  std::string why_not;
  hr::Device* dev = hr::bench::device_for(kind, &why_not);
  if (dev == nullptr) {
    state.SkipWithError(why_not.c_str());
    return;
  }
  hr::StepConfig cfg = sweep.base;
  cfg.micro_batch = state.range(0);
  try {
    hr::TrainStep step(*dev, cfg);
    const hr::Batch batch = hr::make_lm_batch(*dev, cfg.transformer, cfg.batch, cfg.seq_len, 1234);
    step.step(batch);  // warm-up: optimizer state and first-touch allocations
    dev->synchronize();
    dev->memory().reset_peak();
    auto timer = dev->make_timer();
    double total_s = 0;
    const hr::KernelCalls calls = hr::kernel_calls();
    for (auto _ : state) {
      timer->start();
      step.step(batch);
      const double s = timer->stop_seconds();
      state.SetIterationTime(s);
      total_s += s;
    }
    hr::bench::label_attention_kernels(state, calls);
    const hr::MemorySnapshot mem = dev->memory().snapshot();
    const double iters = static_cast<double>(state.iterations());
    const double step_s = total_s / iters;
    const double samples_per_s = static_cast<double>(cfg.batch) / step_s;
    using benchmark::Counter;
    state.counters["micro_batch"] = static_cast<double>(cfg.micro_batch);
    state.counters["accum_steps"] = static_cast<double>(cfg.accum_steps());
    state.counters["step_s"] = step_s;
    state.counters["tokens_per_s"] = static_cast<double>(cfg.batch * cfg.seq_len) / step_s;
    state.counters["samples_per_s"] = samples_per_s;
    for (hr::Consumer c : hr::kAllConsumers)
      state.counters[std::string("peak_") + hr::consumer_name(c) + "_bytes"] =
          Counter(static_cast<double>(mem.peak(c)), Counter::kDefaults, Counter::OneK::kIs1024);
    state.counters["peak_total_bytes"] =
        Counter(static_cast<double>(mem.total_peak_bytes), Counter::kDefaults, Counter::OneK::kIs1024);
    auto& seen = throughput_seen()[case_name];
    seen[cfg.micro_batch] = samples_per_s;
    // Relative to the largest micro-batch run so far in this process (cases run
    // largest first); absent when that one was filtered out.
    const auto largest = seen.rbegin();
    if (largest->first == sweep.micro_batches.front())
      state.counters["relative_per_sample_throughput"] = samples_per_s / largest->second;
  } catch (const hr::OutOfMemory& e) {
    state.SkipWithError((std::string("out of memory: ") + e.what()).c_str());
  }
}

void register_sweep(const std::string& name, hr::BackendKind kind, const hr::props::MicroBatchSweep& sweep) {
  auto* b = hr::bench::register_case(name, [kind, sweep, name](benchmark::State& s) {
    run_case(s, kind, sweep, name);
  });
  b->ArgName("micro_batch")->UseManualTime()->Unit(benchmark::kMillisecond);
  for (int64_t mb : sweep.micro_batches) b->Arg(mb);
}

[[maybe_unused]] const bool registered = [] {
  register_sweep("microbatch/cpu", hr::BackendKind::cpu,
                 hr::props::microbatch_sweep_config(hr::Preset::quick, hr::BackendKind::cpu));
  register_sweep("microbatch/cpu_smoke", hr::BackendKind::cpu, hr::props::microbatch_sweep_smoke_config());
  register_sweep("microbatch/cuda", hr::BackendKind::cuda,
                 hr::props::microbatch_sweep_config(hr::Preset::full, hr::BackendKind::cuda));
  return true;
}();

}  // namespace

BENCHMARK_MAIN();
