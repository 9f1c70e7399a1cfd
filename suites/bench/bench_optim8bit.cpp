// Optimizer step time of fp32 AdamW against 8-bit AdamW (block 256 and 2048) per
// backend over n fp32 parameters. bytes_per_second counts what each step reads and
// writes: parameter and gradient (4 + 4, parameter written back 4) plus the state,
// 16 bytes of fp32 moments or 4 bytes of codes (read and written) and the absmax
// (bytes_moved_per_parameter: 28, or 16 plus the absmax). The codebooks (2 KiB
// per CUDA thread block, read from L2) are not counted.
#include <benchmark/benchmark.h>

#include <fmt/format.h>

#include <string>

#include "harness/device.hpp"
#include "harness/tensor.hpp"
#include "kernels/elementwise/elementwise.hpp"
#include "kernels/optim/optim8.hpp"
#include "suites/bench/bench_support.hpp"

namespace {

using hr::Consumer;
using hr::DType;
using hr::Tensor;

// block 0: fp32 AdamW.
void run_case(benchmark::State& state, hr::Device& dev, int64_t block) {
  const int64_t n = state.range(0);
  Tensor p = Tensor::empty(dev, {n}, DType::f32, Consumer::weights);
  Tensor g = Tensor::empty(dev, {n}, DType::f32, Consumer::gradients);
  hr::ops::fill(p, 0.25f);
  hr::ops::fill(g, 1e-3f);
  const bool q8 = block > 0;
  const int64_t blocks = q8 ? hr::q8::block_count(n, block) : 1;
  Tensor m = Tensor::zeros(dev, {n}, q8 ? DType::u8 : DType::f32, Consumer::optimizer_state);
  Tensor v = Tensor::zeros(dev, {n}, q8 ? DType::u8 : DType::f32, Consumer::optimizer_state);
  Tensor ma = Tensor::zeros(dev, {blocks}, DType::f32, Consumer::optimizer_state);
  Tensor va = Tensor::zeros(dev, {blocks}, DType::f32, Consumer::optimizer_state);
  hr::ops::AdamW8bitOptions opt;
  opt.block_size = q8 ? block : hr::q8::kDefaultBlock;
  int64_t step = 0;
  auto run = [&] {
    if (q8)
      hr::ops::adamw8bit_step(p, g, m, ma, v, va, ++step, hr::ops::AdamWConfig{}, opt);
    else
      hr::ops::adamw_step(p, g, m, v, ++step, hr::ops::AdamWConfig{});
  };
  run();  // warm-up
  dev.synchronize();
  hr::bench::time_iterations(state, dev, run);
  const double state_bytes = q8 ? 2.0 * n + 8.0 * blocks : 8.0 * n;
  const double bytes = 12.0 * n + 2 * state_bytes;
  state.SetBytesProcessed(static_cast<int64_t>(bytes * static_cast<double>(state.iterations())));
  state.counters["state_bytes_per_parameter"] = state_bytes / static_cast<double>(n);
  // What bytes_per_second counts, per parameter: against the card's memory bandwidth
  // it is the fraction of HBM the step reaches.
  state.counters["bytes_moved_per_parameter"] = bytes / static_cast<double>(n);
}

void register_backend(hr::Device& dev, const std::vector<int64_t>& sizes) {
  for (const int64_t block : {int64_t{0}, hr::q8::kDefaultBlock, hr::q8::kLargeBlock}) {
    const std::string name = block == 0 ? fmt::format("adamw/{}/fp32", hr::backend_name(dev.kind()))
                                        : fmt::format("adamw8bit_block{}/{}/fp32", block, hr::backend_name(dev.kind()));
    auto* b = hr::bench::register_case(name, [&dev, block](benchmark::State& st) { run_case(st, dev, block); });
    for (int64_t n : sizes) b->Arg(n);
    b->Unit(benchmark::kMicrosecond);
    hr::bench::use_device_timing(b, dev);
  }
}

}  // namespace

int main(int argc, char** argv) {
  return hr::bench::run_main(
      argc, argv, [](hr::Device& cpu) { register_backend(cpu, {1 << 16, 1 << 20}); },
      [](hr::Device& cuda) { register_backend(cuda, {1 << 20, 1 << 24, 1 << 26}); });
}
