// BM-MP: the training step in fp32, fp16 with the dynamic loss scaler, and bf16
// (both with fp32 master weights), per backend, with the peak bytes of each
// consumer and the scaler's state; and the step's unscale-and-check over every
// gradient with one shared flag against one call (and one synchronisation) per tensor.
#include <benchmark/benchmark.h>

#include <fmt/format.h>

#include <string>
#include <vector>

#include "harness/data/synthetic.hpp"
#include "harness/device.hpp"
#include "harness/step/train_step.hpp"
#include "kernels/reduce/reduce.hpp"
#include "suites/bench/bench_support.hpp"

namespace {

using namespace hr;

struct Variant {
  const char* name;
  DType compute;
};
constexpr Variant kVariants[] = {{"fp32", DType::f32}, {"fp16_scaler", DType::f16}, {"bf16", DType::bf16}};

void run_step(benchmark::State& state, Device& dev, StepConfig cfg) {
  const MemorySnapshot base = dev.memory().snapshot();
  const Batch batch = cfg.model == ModelKind::mlp ? make_mlp_batch(dev, cfg.mlp, cfg.batch, 1)
                                                  : make_lm_batch(dev, cfg.transformer, cfg.batch, cfg.seq_len, 1);
  TrainStep step(dev, cfg);
  step.step(batch);  // warm-up
  dev.synchronize();
  dev.memory().reset_peak();
  bench::time_iterations(state, dev, [&] { step.step(batch); });
  const MemorySnapshot after = dev.memory().snapshot();
  const double items = static_cast<double>(cfg.model == ModelKind::mlp ? cfg.batch : cfg.batch * cfg.seq_len);
  state.counters[cfg.model == ModelKind::mlp ? "samples_per_s" : "tokens_per_s"] =
      benchmark::Counter(items, benchmark::Counter::kIsIterationInvariantRate);
  for (Consumer c : kAllConsumers)
    state.counters[std::string("peak_") + consumer_name(c)] =
        benchmark::Counter(static_cast<double>(after.peak(c) - base.current(c)), benchmark::Counter::kDefaults,
                           benchmark::Counter::kIs1024);
  state.counters["loss_scale"] = cfg.loss_scaling() ? step.scaler().scale() : 1.0;
  state.counters["steps_skipped"] = static_cast<double>(step.steps_skipped());
  state.counters["unscale_passes"] = static_cast<double>(step.unscale_passes());
}

// Every gradient tensor of the model's step: one pass with a shared flag, or one
// call per tensor (each reading its flag back).
void run_unscale(benchmark::State& state, Device& dev, StepConfig cfg, bool shared_flag) {
  TrainStep step(dev, cfg);
  std::vector<Tensor*> grads;
  for (Param& p : step.params().all())
    if (p.grad.defined()) grads.push_back(&p.grad);
  bench::time_iterations(state, dev, [&] {
    if (shared_flag) {
      benchmark::DoNotOptimize(ops::unscale_and_check_all(grads, 1.f));
    } else {
      bool found = false;
      for (Tensor* g : grads) found = ops::unscale_and_check(*g, 1.f) || found;
      benchmark::DoNotOptimize(found);
    }
  });
  state.counters["tensors"] = static_cast<double>(grads.size());
}

void register_backend(Device& dev, Preset preset) {
  for (ModelKind model : {ModelKind::mlp, ModelKind::transformer}) {
    for (const Variant& v : kVariants) {
      StepConfig cfg = step_config_for(model, preset);
      cfg.precision.compute = v.compute;
      const std::string name = fmt::format("mp/{}/{}/{}/{}", model_kind_name(model), backend_name(dev.kind()), v.name,
                                           preset_name(preset));
      auto* b = hr::bench::register_case(name, [&dev, cfg](benchmark::State& st) { run_step(st, dev, cfg); });
      b->Unit(benchmark::kMillisecond);
      bench::use_device_timing(b, dev);
    }
    for (bool shared : {true, false}) {
      StepConfig cfg = step_config_for(model, preset);
      const std::string name = fmt::format("mp_unscale/{}/{}/{}/{}", model_kind_name(model), backend_name(dev.kind()),
                                           shared ? "one_flag" : "per_tensor", preset_name(preset));
      auto* b = hr::bench::register_case(
          name, [&dev, cfg, shared](benchmark::State& st) { run_unscale(st, dev, cfg, shared); });
      b->Unit(benchmark::kMicrosecond);
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
