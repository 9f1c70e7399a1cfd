// Bandwidth of the row-wise ops (layernorm forward / backward, masked softmax
// forward / backward, fused cross-entropy forward / backward) per backend x dtype.
// They are memory-bound: bytes_per_second counts the bytes each call must read
// and write once (inputs, outputs, saved statistics), over the time of the call.
// CUDA cases are timed by device events on the Device's stream (manual time) at
// training sizes (GPT-2-small rows, 50304-entry vocabularies); CPU cases stay small
// so the smoke run (--benchmark_filter=cpu|smoke, --benchmark_min_time=0.001) is quick.
#include <benchmark/benchmark.h>

#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "harness/device.hpp"
#include "harness/tensor.hpp"
#include "kernels/crossentropy/crossentropy.hpp"
#include "kernels/elementwise/elementwise.hpp"
#include "kernels/layernorm/layernorm.hpp"
#include "kernels/softmax/softmax.hpp"
#include "suites/bench/bench_support.hpp"

namespace {

using hr::Consumer;
using hr::DType;
using hr::Tensor;

// A case works on rows x cols elements (softmax: rows = B * H * T, cols = S = T).
struct Buffers {
  Tensor x, y, dy, dx, gamma, beta, mean, rstd, dgamma, dbeta, targets;
  hr::ops::AttnMask mask;
};

struct RowCase {
  const char* name;
  // Bytes read + written per call for element size s.
  double (*bytes)(int64_t rows, int64_t cols, double s);
  void (*run)(Buffers& t);
};

const RowCase kCases[] = {
    {"layernorm_forward", [](int64_t r, int64_t c, double s) { return 2.0 * r * c * s + 8.0 * r + 2.0 * c * s; },
     [](Buffers& t) { hr::ops::layernorm_forward(t.x, t.gamma, t.beta, 1e-5f, t.y, t.mean, t.rstd); }},
    {"layernorm_backward", [](int64_t r, int64_t c, double s) { return 3.0 * r * c * s + 8.0 * r + 17.0 * c; },
     [](Buffers& t) {
       hr::ops::layernorm_backward(t.dy, t.x, t.gamma, t.mean, t.rstd, t.dx, t.dgamma, t.dbeta);
     }},
    {"softmax_forward_causal", [](int64_t r, int64_t c, double s) { return 2.0 * r * c * s; },
     [](Buffers& t) {
       hr::ops::softmax_forward(t.x.reshape(t.y.shape()), t.mask, 0.125f, t.y);
     }},
    {"softmax_backward", [](int64_t r, int64_t c, double s) { return 3.0 * r * c * s; },
     [](Buffers& t) { hr::ops::softmax_backward(t.y, t.dy, 0.125f, t.dx); }},
    // The forward includes copying the per-token losses to the host (N floats) and
    // reducing them there: that is what a call costs.
    {"cross_entropy_forward", [](int64_t r, int64_t c, double s) { return 1.0 * r * c * s + 8.0 * r; },
     [](Buffers& t) {
       Tensor none;
       benchmark::DoNotOptimize(hr::ops::cross_entropy_forward(t.x, t.targets, {}, none));
     }},
    {"cross_entropy_backward", [](int64_t r, int64_t c, double s) { return 2.0 * r * c * s + 4.0 * r; },
     [](Buffers& t) { hr::ops::cross_entropy_backward(t.x, t.targets, {}, t.dx); }},
};

Buffers make_buffers(hr::Device& dev, const RowCase& op, int64_t rows, int64_t cols, DType dtype) {
  Buffers t;
  const bool softmax = std::string(op.name).rfind("softmax", 0) == 0;
  // Softmax rows are rows / cols causal [T, T] score blocks (T = cols).
  const hr::Shape shape = softmax ? hr::Shape{rows / cols, 1, cols, cols} : hr::Shape{rows, cols};
  t.x = Tensor::empty(dev, {rows, cols}, dtype, Consumer::activations);
  t.y = Tensor::empty(dev, shape, dtype, Consumer::activations);
  t.dy = Tensor::empty(dev, shape, dtype, Consumer::activations);
  t.dx = Tensor::empty(dev, shape, dtype, Consumer::activations);
  t.gamma = Tensor::empty(dev, {cols}, dtype, Consumer::weights);
  t.beta = Tensor::empty(dev, {cols}, dtype, Consumer::weights);
  t.mean = Tensor::empty(dev, {rows}, DType::f32, Consumer::activations);
  t.rstd = Tensor::empty(dev, {rows}, DType::f32, Consumer::activations);
  t.dgamma = Tensor::zeros(dev, {cols}, DType::f32, Consumer::gradients);
  t.dbeta = Tensor::zeros(dev, {cols}, DType::f32, Consumer::gradients);
  std::vector<int32_t> targets(static_cast<size_t>(rows));
  for (int64_t i = 0; i < rows; ++i) targets[i] = static_cast<int32_t>((i * 7919) % cols);
  t.targets = Tensor::from_host_i32(dev, targets, {rows}, Consumer::workspace);
  t.mask.causal = softmax;
  // Non-zero, finite values; bandwidth does not depend on them.
  hr::ops::fill(t.x, 0.75f);
  hr::ops::fill(t.dy, -0.5f);
  hr::ops::fill(t.y, 1.f / static_cast<float>(cols));
  hr::ops::fill(t.gamma, 1.f);
  hr::ops::fill(t.beta, 0.f);
  hr::ops::fill(t.mean, 0.75f);
  hr::ops::fill(t.rstd, 1.f);
  dev.synchronize();
  return t;
}

void run_case(benchmark::State& state, hr::Device& dev, const RowCase& op, DType dtype) {
  const int64_t rows = state.range(0), cols = state.range(1);
  Buffers t = make_buffers(dev, op, rows, cols, dtype);
  op.run(t);  // warm-up (first launch, page faults)
  dev.synchronize();
  hr::bench::time_iterations(state, dev, [&] { op.run(t); });
  const double bytes = op.bytes(rows, cols, static_cast<double>(hr::dtype_size(dtype)));
  state.SetBytesProcessed(static_cast<int64_t>(bytes * static_cast<double>(state.iterations())));
  state.counters["rows"] = static_cast<double>(rows);
  state.counters["cols"] = static_cast<double>(cols);
}

// shapes[i] = {rows, cols} per op family, in kCases order by prefix.
struct Shapes {
  std::vector<std::pair<int64_t, int64_t>> layernorm, softmax, cross_entropy;
};

void register_backend(hr::Device& dev, const Shapes& shapes) {
  for (const RowCase& op : kCases) {
    const std::string n = op.name;
    const auto& sh = n.rfind("layernorm", 0) == 0 ? shapes.layernorm
                     : n.rfind("softmax", 0) == 0 ? shapes.softmax
                                                  : shapes.cross_entropy;
    for (DType dtype : hr::kFloatDTypes) {
      const std::string name = fmt::format("{}/{}/{}", op.name, hr::backend_name(dev.kind()), hr::dtype_name(dtype));
      auto* b = hr::bench::register_case(
          name, [&dev, &op, dtype](benchmark::State& st) { run_case(st, dev, op, dtype); });
      for (const auto& [r, c] : sh) b->Args({r, c});
      b->Unit(benchmark::kMicrosecond);
      hr::bench::use_device_timing(b, dev);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  return hr::bench::run_main(
      argc, argv, [](hr::Device& cpu) { register_backend(cpu, Shapes{{{64, 768}}, {{128, 128}}, {{16, 4096}}}); },
      [](hr::Device& cuda) {
        // GPT-2 small / large hidden sizes over 16k tokens; a 12-head x 1024 causal
        // score block per batch of 8; cross-entropy over 8k tokens of a 50304 vocabulary.
        register_backend(cuda, Shapes{{{16384, 768}, {16384, 1600}, {16384, 4096}},
                                      {{8 * 12 * 1024, 1024}},
                                      {{8192, 50304}}});
      });
}
