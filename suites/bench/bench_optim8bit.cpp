// Optimizer step time of fp32 AdamW against 8-bit AdamW (block 256 and 2048) per
// backend over n fp32 parameters. bytes_per_second counts what each step reads and
// writes: parameter and gradient (4 + 4, parameter written back 4) plus the state,
// 16 bytes of fp32 moments or 4 bytes of codes (read and written) and the absmax
// (bytes_moved_per_parameter: 28, or 16 plus the absmax). The codebooks (2 KiB
// per CUDA thread block, read from L2) are not counted.
#include <benchmark/benchmark.h>

#include <fmt/format.h>

#include <string>
#include <utility>
#include <vector>

#include "harness/device.hpp"
#include "harness/models/presets.hpp"
#include "harness/models/transformer.hpp"
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

// The optimizer step over a model's own parameters (BM-MB's transformer: the full
// preset on a GPU, 219.3M parameters; the quick one on the CPU), as
// the optimizers keep them (8-bit moments from 4096 elements, fp32 below), stepped
// one call per tensor or all in one call (adamw_step_many, adamw8bit_step_many: on a
// GPU a few launches). Per-tensor work on the host and in launches is what the two
// differ by; bytes_per_second counts the same bytes as the cases above.
void run_model_case(benchmark::State& state, hr::Device& dev, int64_t block, bool many) {
  const hr::TransformerPreset preset = hr::transformer_preset(dev.is_cuda() ? hr::Preset::full : hr::Preset::quick);
  hr::TransformerModel model(dev, preset.model, hr::ParamStorage{}, 1234);
  struct State {
    Tensor m, v, ma, va;
    bool q8 = false;
  };
  std::vector<State> states;
  double params = 0, bytes = 0;
  hr::ops::AdamW8bitOptions opt;
  opt.block_size = block > 0 ? block : hr::q8::kDefaultBlock;
  for (hr::Param& p : model.params().all()) {
    hr::ops::fill(p.grad, 1e-3f);
    const int64_t n = p.master.numel();
    State st;
    st.q8 = block > 0 && n >= hr::q8::kMin8bitNumel;
    const int64_t blocks = st.q8 ? hr::q8::block_count(n, block) : 1;
    st.m = Tensor::zeros(dev, p.master.shape(), st.q8 ? DType::u8 : DType::f32, Consumer::optimizer_state);
    st.v = Tensor::zeros(dev, p.master.shape(), st.q8 ? DType::u8 : DType::f32, Consumer::optimizer_state);
    st.ma = Tensor::zeros(dev, {blocks}, DType::f32, Consumer::optimizer_state);
    st.va = Tensor::zeros(dev, {blocks}, DType::f32, Consumer::optimizer_state);
    states.push_back(std::move(st));
    const double state_bytes = states.back().q8 ? 2.0 * n + 8.0 * blocks : 8.0 * n;
    params += static_cast<double>(n);
    bytes += 12.0 * static_cast<double>(n) + 2 * state_bytes;
  }
  auto& ps = model.params().all();
  std::vector<hr::ops::AdamW8bitTensor> q8;
  std::vector<hr::ops::AdamWTensor> f32;
  for (size_t i = 0; i < ps.size(); ++i) {
    State& st = states[i];
    if (st.q8)
      q8.push_back({&ps[i].master, &ps[i].grad, &st.m, &st.ma, &st.v, &st.va, hr::ops::AdamWConfig{}, opt});
    else
      f32.push_back({&ps[i].master, &ps[i].grad, &st.m, &st.v, hr::ops::AdamWConfig{}});
  }
  int64_t step = 0;
  auto run = [&] {
    ++step;
    if (many) {
      hr::ops::adamw8bit_step_many(q8, step);
      hr::ops::adamw_step_many(f32, step);
      return;
    }
    for (const auto& t : q8)
      hr::ops::adamw8bit_step(*t.param, *t.grad, *t.m_codes, *t.m_absmax, *t.v_codes, *t.v_absmax, step, t.cfg, t.opt);
    for (const auto& t : f32) hr::ops::adamw_step(*t.param, *t.grad, *t.m, *t.v, step, t.cfg);
  };
  run();  // warm-up
  dev.synchronize();
  hr::bench::time_iterations(state, dev, run);
  state.SetBytesProcessed(static_cast<int64_t>(bytes * static_cast<double>(state.iterations())));
  state.counters["parameters"] = params;
  state.counters["tensors"] = static_cast<double>(ps.size());
  state.counters["bytes_moved_per_parameter"] = bytes / params;
}

void register_backend(hr::Device& dev, const std::vector<int64_t>& sizes) {
  for (const int64_t block : {int64_t{0}, hr::q8::kDefaultBlock}) {
    for (const bool many : {false, true}) {
      const std::string name = fmt::format("{}_model/{}/{}", block == 0 ? "adamw" : "adamw8bit_block256",
                                           hr::backend_name(dev.kind()), many ? "many" : "per_tensor");
      auto* b = hr::bench::register_case(name, [&dev, block, many](benchmark::State& st) {
        run_model_case(st, dev, block, many);
      });
      b->Unit(benchmark::kMicrosecond);
      hr::bench::use_device_timing(b, dev);
    }
  }

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
