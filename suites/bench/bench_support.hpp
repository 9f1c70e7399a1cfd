// Shared plumbing of the benchmark binaries: the main() that registers the CPU
// cases and, only where a CUDA device answers, the CUDA cases (otherwise the
// reason goes into the benchmark context), and the timing mode per device.
#pragma once

#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <exception>
#include <memory>
#include <string>

#include "harness/device.hpp"
#include "harness/kernel_calls.hpp"
#include "harness/results/results.hpp"

namespace hr::bench {

// The attention kernels a case ran since `before` (kernel_calls.hpp), as its label:
// "attention tensor_core", "attention forward cudnn, backward scalar" (the report's
// wording); none where no attention ran. A form that fell back shows as what ran.
inline void label_attention_kernels(benchmark::State& state, const KernelCalls& before) {
  const std::string label = attention_kernels_label(kernel_calls_per_run(before, kernel_calls(), 1.0));
  if (!label.empty()) state.SetLabel("attention " + label);
}

// Device work is timed by CUDA events (manual time); CPU work by wall time, since
// OpenBLAS and the ops use threads the main thread's CPU time would not see.
inline benchmark::internal::Benchmark* use_device_timing(benchmark::internal::Benchmark* b, const Device& dev) {
  return dev.is_cuda() ? b->UseManualTime() : b->UseRealTime();
}

// The timed loop, per nvbench's practice. On the GPU each sample is timed by device
// events with the caches flushed before it (Device::flush_caches), so a sample
// reads its operands from memory, as a training step's first touch of a tensor
// does. A sample shorter than kMinEventSpan is below the events' resolution (about
// half a microsecond) and launch jitter: such work is timed as a batch of
// repetitions between one pair of events, warm, with no flush before it (the
// counter l2_flushed says which way a case was timed), each iteration reporting
// the batch's time over its repetitions. On the CPU, Google Benchmark's wall clock.
// Warm-up is the caller's, since some reset the memory peaks between warm-up and
// timing.
inline constexpr double kMinEventSpan = 50e-6;  // seconds

template <typename Fn>
void time_iterations(benchmark::State& state, Device& dev, Fn&& fn) {
  if (dev.is_cuda()) {
    const std::unique_ptr<Timer> timer = dev.make_timer();
    // One probe sample decides between single flushed samples and batches.
    dev.flush_caches();
    timer->start();
    fn();
    const double probe_s = timer->stop_seconds();
    int reps = 1;
    if (probe_s < kMinEventSpan)
      reps = static_cast<int>(std::min(1000.0, std::ceil(kMinEventSpan / std::max(probe_s, 1e-7))));
    for (auto _ : state) {
      // A flush before a batch would cost its time on every sample and cool only the
      // batch's first repetition.
      if (reps == 1) dev.flush_caches();
      timer->start();
      for (int r = 0; r < reps; ++r) fn();
      state.SetIterationTime(timer->stop_seconds() / reps);
    }
    state.counters["reps_per_sample"] = reps;
    state.counters["l2_flushed"] = reps == 1 ? 1 : 0;
  } else {
    for (auto _ : state) {
      fn();
      benchmark::ClobberMemory();
    }
  }
}

// RegisterBenchmark with the case's body guarded: Google Benchmark does not catch
// exceptions, so one throw (an out-of-memory, a failed launch) would end the binary
// and lose every case after it; here it ends that case alone, its message in the
// case's record (error_occurred), which gpu-check's bench step counts as a failure.
template <typename Fn, typename... Args>
benchmark::internal::Benchmark* register_case(const std::string& name, Fn fn, Args... args) {
  return benchmark::RegisterBenchmark(name.c_str(), [=](benchmark::State& st) {
    try {
      fn(st, args...);
    } catch (const std::exception& e) {
      st.SkipWithError(e.what());
    }
  });
}

// One device per backend for the whole binary (created on first use; the CUDA one
// only where a device answers, else nullptr with *why_not saying why), for
// benchmarks that register their cases per backend themselves.
inline Device* device_for(BackendKind kind, std::string* why_not) {
  if (kind == BackendKind::cpu) {
    static const std::unique_ptr<Device> cpu = make_cpu_device();
    return cpu.get();
  }
  // A static of its own, constructed after the CUDA runtime has started, so that it
  // is destroyed at exit before the runtime tears the context down (destroyed later,
  // cuBLAS's workspace and the pool are reported as leaks by compute-sanitizer).
  static std::string why;
  static const std::unique_ptr<Device> cuda = cuda_device_available(&why) ? make_cuda_device(0) : nullptr;
  if (!cuda && why_not != nullptr) *why_not = why;
  return cuda.get();
}

// Runs the benchmark binary: register_backend(device, is_cuda) is called for the
// CPU and, where a GPU answers, for CUDA; the devices outlive the run.
inline int run_main(int argc, char** argv, const std::function<void(Device&)>& register_cpu,
                    const std::function<void(Device&)>& register_cuda) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  const std::unique_ptr<Device> cpu = make_cpu_device();
  register_cpu(*cpu);
  // CUDA cases exist only where a device answers: nothing is registered (and so
  // nothing reported as a result) on a machine without one.
  std::unique_ptr<Device> cuda;
  std::string why_not;
  if (cuda_device_available(&why_not)) {
    cuda = make_cuda_device(0);
    register_cuda(*cuda);
  } else {
    benchmark::AddCustomContext("cuda", "not run: " + why_not);
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}

}  // namespace hr::bench
