// Shared plumbing of the benchmark binaries: the main() that registers the CPU
// cases and, only where a CUDA device answers, the CUDA cases (otherwise the
// reason goes into the benchmark context), and the timing mode per device.
#pragma once

#include <benchmark/benchmark.h>

#include <functional>
#include <memory>
#include <string>

#include "harness/device.hpp"

namespace hr::bench {

// Device work is timed by CUDA events (manual time); CPU work by wall time, since
// OpenBLAS and the ops use threads the main thread's CPU time would not see.
inline benchmark::internal::Benchmark* use_device_timing(benchmark::internal::Benchmark* b, const Device& dev) {
  return dev.is_cuda() ? b->UseManualTime() : b->UseRealTime();
}

// The timed loop: each iteration of fn() timed by device events on the GPU (for
// UseManualTime), by Google Benchmark's wall clock on the CPU. Warm-up is the
// caller's, since some reset the memory peaks between warm-up and timing.
template <typename Fn>
void time_iterations(benchmark::State& state, Device& dev, Fn&& fn) {
  if (dev.is_cuda()) {
    const std::unique_ptr<Timer> timer = dev.make_timer();
    for (auto _ : state) {
      timer->start();
      fn();
      state.SetIterationTime(timer->stop_seconds());
    }
  } else {
    for (auto _ : state) {
      fn();
      benchmark::ClobberMemory();
    }
  }
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
