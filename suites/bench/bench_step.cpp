// The full training step of both controlled models (zero grads, forward +
// backward over the micro-batches, unscale, optimizer step), per backend x dtype
// at the quick preset (CPU; fast enough for the smoke run) and the full preset
// (CUDA, device-timed). Counters: tokens (or samples) per second and the peak
// bytes of each consumer over the measured steps, from the tracking allocator.
#include <benchmark/benchmark.h>

#include <fmt/format.h>

#include <memory>
#include <string>

#include "harness/data/synthetic.hpp"
#include "harness/device.hpp"
#include "harness/step/train_step.hpp"
#include "suites/bench/bench_support.hpp"

namespace {

using namespace hr;

void run_step(benchmark::State& state, Device& dev, StepConfig cfg) {
  const MemorySnapshot base = dev.memory().snapshot();  // what the device held before this case
  const Batch batch = cfg.model == ModelKind::mlp ? make_mlp_batch(dev, cfg.mlp, cfg.batch, 1)
                                                  : make_lm_batch(dev, cfg.transformer, cfg.batch, cfg.seq_len, 1);
  TrainStep step(dev, cfg);
  step.step(batch);  // warm-up: first touches, BLAS thread start-up
  dev.synchronize();
  dev.memory().reset_peak();
  const KernelCalls calls = kernel_calls();
  bench::time_iterations(state, dev, [&] { step.step(batch); });
  bench::label_attention_kernels(state, calls);
  const MemorySnapshot after = dev.memory().snapshot();
  const double items = static_cast<double>(cfg.model == ModelKind::mlp ? cfg.batch : cfg.batch * cfg.seq_len);
  state.counters[cfg.model == ModelKind::mlp ? "samples_per_s" : "tokens_per_s"] =
      benchmark::Counter(items, benchmark::Counter::kIsIterationInvariantRate);
  for (Consumer c : kAllConsumers)
    state.counters[std::string("peak_") + consumer_name(c)] =
        benchmark::Counter(static_cast<double>(after.peak(c) - base.current(c)), benchmark::Counter::kDefaults,
                           benchmark::Counter::kIs1024);
  state.counters["micro_batch"] = static_cast<double>(cfg.micro_batch);
  state.counters["accum_steps"] = static_cast<double>(cfg.accum_steps());
}

void register_backend(Device& dev, Preset preset) {
  for (ModelKind model : {ModelKind::mlp, ModelKind::transformer}) {
    for (DType dtype : kFloatDTypes) {
      StepConfig cfg = step_config_for(model, preset);
      cfg.precision.compute = dtype;
      const std::string name =
          fmt::format("step/{}/{}/{}/{}", model_kind_name(model), backend_name(dev.kind()), dtype_name(dtype),
                      preset_name(preset));
      auto* b = hr::bench::register_case(name, [&dev, cfg](benchmark::State& st) { run_step(st, dev, cfg); });
      b->Unit(benchmark::kMillisecond);
      bench::use_device_timing(b, dev);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  return bench::run_main(
      argc, argv, [](Device& cpu) { register_backend(cpu, Preset::quick); },
      [](Device& cuda) {
        register_backend(cuda, Preset::quick);
        register_backend(cuda, Preset::full);
      });
}
