// Bandwidth of the element-wise and whole-tensor ops (add, scale, axpy, cast, GELU,
// dropout, reductions, unscale-and-check, SGD and AdamW steps) per backend x dtype.
// They are memory-bound, so the figure of merit is bytes_per_second: bytes read
// plus bytes written per call, over the time of the call. CUDA cases are timed by
// device events on the Device's stream (manual time) up to 64M elements, where
// every buffer is far larger than L2; CPU cases stay small so the smoke run
// (--benchmark_filter=cpu|smoke, --benchmark_min_time=0.001) is quick.
#include <benchmark/benchmark.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "harness/device.hpp"
#include "harness/tensor.hpp"
#include "kernels/common/philox.hpp"
#include "kernels/dropout/dropout.hpp"
#include "kernels/elementwise/elementwise.hpp"
#include "kernels/gelu/gelu.hpp"
#include "kernels/optim/optim.hpp"
#include "kernels/reduce/reduce.hpp"
#include "suites/bench/bench_support.hpp"

namespace {

using hr::Consumer;
using hr::DType;
using hr::Tensor;

// The tensors one case needs, of n elements: a, b, out in the case's dtype; the
// fp32 gradient and optimizer state the optimizer steps read.
struct Buffers {
  Tensor a, b, out, grad32, m, v;
  uint64_t step = 0;
};

struct OpCase {
  const char* name;
  // Bytes read + written per element, for element size s of the case's dtype.
  double (*bytes_per_element)(double s);
  void (*run)(Buffers& t);
};

const OpCase kCases[] = {
    {"add", [](double s) { return 3 * s; }, [](Buffers& t) { hr::ops::add(t.a, t.b, t.out); }},
    {"scale", [](double s) { return 2 * s; }, [](Buffers& t) { hr::ops::scale(t.a, 0.5f, t.out); }},
    {"axpy", [](double s) { return 3 * s; }, [](Buffers& t) { hr::ops::axpy(1e-3f, t.a, t.out); }},
    {"cast_from_fp32", [](double s) { return 4 + s; }, [](Buffers& t) { hr::ops::cast(t.grad32, t.out); }},
    {"gelu_forward", [](double s) { return 2 * s; }, [](Buffers& t) { hr::ops::gelu_forward(t.a, t.out); }},
    {"gelu_backward", [](double s) { return 3 * s; }, [](Buffers& t) { hr::ops::gelu_backward(t.a, t.b, t.out); }},
    {"dropout_forward", [](double s) { return 2 * s; },
     [](Buffers& t) {
       hr::ops::dropout_forward(t.a, 0.1f, 1234, t.step, t.out);
       t.step += hr::philox_advance(static_cast<uint64_t>(t.a.numel()));
     }},
    {"sum", [](double s) { return s; }, [](Buffers& t) { benchmark::DoNotOptimize(hr::ops::sum(t.a)); }},
    {"squared_norm", [](double s) { return s; },
     [](Buffers& t) { benchmark::DoNotOptimize(hr::ops::squared_norm(t.a)); }},
    {"unscale_and_check", [](double s) { return 2 * s; },
     [](Buffers& t) { benchmark::DoNotOptimize(hr::ops::unscale_and_check(t.out, 1.f)); }},
    {"sgd_momentum_step", [](double s) { return 2 * s + 4 + 8; },
     [](Buffers& t) { hr::ops::sgd_step(t.out, t.grad32, t.m, hr::ops::SgdConfig{1e-3f, 0.9f, 0.f}); }},
    {"adamw_step", [](double s) { return 2 * s + 4 + 8 + 8; },
     [](Buffers& t) {
       hr::ops::adamw_step(t.out, t.grad32, t.m, t.v, static_cast<int64_t>(++t.step), hr::ops::AdamWConfig{});
     }},
};

Buffers make_buffers(hr::Device& dev, int64_t n, DType dtype) {
  Buffers t;
  t.a = Tensor::empty(dev, {n}, dtype, Consumer::activations);
  t.b = Tensor::empty(dev, {n}, dtype, Consumer::activations);
  t.out = Tensor::empty(dev, {n}, dtype, Consumer::weights);
  t.grad32 = Tensor::empty(dev, {n}, DType::f32, Consumer::gradients);
  t.m = Tensor::zeros(dev, {n}, DType::f32, Consumer::optimizer_state);
  t.v = Tensor::zeros(dev, {n}, DType::f32, Consumer::optimizer_state);
  // Non-zero, finite values; bandwidth does not depend on them.
  hr::ops::fill(t.a, 0.75f);
  hr::ops::fill(t.b, -0.5f);
  hr::ops::fill(t.out, 0.25f);
  hr::ops::fill(t.grad32, 1e-3f);
  dev.synchronize();
  return t;
}

void run_case(benchmark::State& state, hr::Device& dev, const OpCase& op, DType dtype) {
  const int64_t n = state.range(0);
  Buffers t = make_buffers(dev, n, dtype);
  op.run(t);  // warm-up (first launch, page faults)
  dev.synchronize();
  hr::bench::time_iterations(state, dev, [&] { op.run(t); });
  const double bytes = op.bytes_per_element(static_cast<double>(hr::dtype_size(dtype))) * static_cast<double>(n);
  state.SetBytesProcessed(static_cast<int64_t>(bytes * static_cast<double>(state.iterations())));
  state.counters["elements"] = static_cast<double>(n);
}

void register_backend(hr::Device& dev, const std::vector<int64_t>& sizes) {
  for (const OpCase& op : kCases) {
    for (DType dtype : hr::kFloatDTypes) {
      const std::string name = fmt::format("{}/{}/{}", op.name, hr::backend_name(dev.kind()), hr::dtype_name(dtype));
      auto* b = hr::bench::register_case(
          name, [&dev, &op, dtype](benchmark::State& st) { run_case(st, dev, op, dtype); });
      for (int64_t n : sizes) b->Arg(n);
      b->Unit(benchmark::kMicrosecond);
      hr::bench::use_device_timing(b, dev);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  return hr::bench::run_main(
      argc, argv, [](hr::Device& cpu) { register_backend(cpu, {4096, 1 << 16, 1 << 20}); },
      [](hr::Device& cuda) { register_backend(cuda, {1 << 20, 1 << 24, 1 << 26}); });
}
