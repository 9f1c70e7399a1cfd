// Matrix products and attention: throughput of our wrappers, and of cuBLAS alone
// (the same cublasGemmEx call without the wrapper's checks and dispatch) so the
// wrapper's overhead is visible; naive against memory-efficient attention over T
// (on the GPU with the scalar kernels and with the tensor-core ones).
// GPU cases are timed with device events (UseManualTime) and registered only when
// a CUDA device answers; CPU cases are small and named "cpu" for the smoke run.
#include <benchmark/benchmark.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "harness/device.hpp"
#include "harness/op_profile.hpp"
#include "harness/tensor.hpp"
#include "harness/timing.hpp"
#include "kernels/attention/attention.hpp"
#include "kernels/matmul/matmul.hpp"
#include "suites/bench/bench_support.hpp"

#if HEADROOM_HAVE_CUDA
#include "harness/cuda_check.cuh"
#include "kernels/attention/attention_cuda.hpp"
#endif

namespace hr {
namespace {

Device& device(BackendKind kind) {
  static std::unique_ptr<Device> cpu, cuda;
  auto& slot = kind == BackendKind::cpu ? cpu : cuda;
  if (!slot) slot = make_device(kind);
  return *slot;
}

Tensor random_tensor(Device& dev, Shape shape, DType dt, uint32_t seed) {
  std::vector<float> v(static_cast<size_t>(shape_numel(shape)));
  uint32_t x = seed * 2654435761u + 1u;
  for (auto& f : v) {
    x = x * 1664525u + 1013904223u;
    f = static_cast<float>(x >> 8) / 16777216.f - 0.5f;
  }
  return Tensor::from_host(dev, v, std::move(shape), dt, Consumer::activations);
}

// Times `fn` per iteration: device events on the GPU (manual time), wall clock on the CPU.
template <typename Fn>
void run_timed(benchmark::State& state, Device& dev, Fn&& fn) {
  fn();  // warm-up: cuBLAS heuristics, first-touch of pages
  dev.synchronize();
  bench::time_iterations(state, dev, [&] { fn(); });
}

void set_flops(benchmark::State& state, double flops_per_iter) {
  state.counters["FLOP/s"] =
      benchmark::Counter(flops_per_iter * static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
}

// Square GEMM n x n x n through ops::matmul.
void bm_matmul(benchmark::State& state, BackendKind kind, DType dt) {
  Device& dev = device(kind);
  const int64_t n = state.range(0);
  Tensor a = random_tensor(dev, {n, n}, dt, 1), b = random_tensor(dev, {n, n}, dt, 2);
  Tensor c = Tensor::empty(dev, {n, n}, dt, Consumer::activations);
  run_timed(state, dev, [&] { ops::matmul(a, false, b, false, c); });
  set_flops(state, 2.0 * n * n * n);
}

#if HEADROOM_HAVE_CUDA
cudaDataType_t cuda_type(DType t) {
  return t == DType::f16 ? CUDA_R_16F : t == DType::bf16 ? CUDA_R_16BF : CUDA_R_32F;
}

// The same product as bm_matmul on CUDA, as one bare cublasGemmEx call.
void bm_cublas_alone(benchmark::State& state, DType dt) {
  Device& dev = device(BackendKind::cuda);
  const int64_t n = state.range(0);
  Tensor a = random_tensor(dev, {n, n}, dt, 1), b = random_tensor(dev, {n, n}, dt, 2);
  Tensor c = Tensor::empty(dev, {n, n}, dt, Consumer::activations);
  auto handle = static_cast<cublasHandle_t>(dev.cublas_handle());
  const float alpha = 1.f, beta = 0.f;
  const int ni = static_cast<int>(n);
  const cudaDataType_t t = cuda_type(dt);
  run_timed(state, dev, [&] {
    HR_CUBLAS_CHECK(cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, ni, ni, ni, &alpha, b.data(), t, ni, a.data(), t,
                                 ni, &beta, c.data(), t, ni, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  });
  set_flops(state, 2.0 * n * n * n);
}
#endif

// Attention forward + backward at sequence length T; counters: peak bytes kept for
// the backward pass (activations) and of the whole step, above the inputs.
// On the GPU, `kernel` picks the memory-efficient form's kernels (scalar, tensor
// cores, or cuDNN's fused attention, whose graphs are built in the warm-up; its
// backward deterministic as in the runs, or not where `cudnn_deterministic` is false).
void bm_attention(benchmark::State& state, BackendKind kind, ops::AttentionImpl impl, int64_t B, int64_t H,
                  int64_t D, ops::GpuAttentionKernel kernel, bool cudnn_deterministic) {
  Device& dev = device(kind);
  const int64_t T = state.range(0);
  const DType dt = kind == BackendKind::cuda ? DType::bf16 : DType::f32;
  Tensor q = random_tensor(dev, {B, H, T, D}, dt, 3), k = random_tensor(dev, {B, H, T, D}, dt, 4),
         v = random_tensor(dev, {B, H, T, D}, dt, 5), g = random_tensor(dev, {B, H, T, D}, dt, 6);
#if HEADROOM_HAVE_CUDA
  // cuDNN's backward deterministic or not for this case, put back after it (also on
  // a throw); availability is asked under it (each kind's graphs must build).
  const ops::cuda::ScopedCudnnDeterminism determinism(cudnn_deterministic);
  std::string why_not;
  if (!ops::gpu_attention_kernel_available(dev, kernel, dt, D, &why_not)) {
    const std::string what =
        kernel == ops::GpuAttentionKernel::cudnn ? "cuDNN attention unavailable: " : "tensor-core attention unavailable: ";
    state.SkipWithError((what + why_not).c_str());
    return;
  }
  if (kernel == ops::GpuAttentionKernel::cudnn)
    state.SetLabel(ops::cuda::cudnn_attention_library() +
                   (cudnn_deterministic ? ", deterministic backward" : ", non-deterministic backward"));
#endif
  const ops::ScopedGpuAttentionKernel selected(kernel);  // restored after, also on a throw
  Tensor out = Tensor::empty(dev, {B, H, T, D}, dt, Consumer::activations);
  Tensor dq = Tensor::empty(dev, {B, H, T, D}, dt, Consumer::activations), dk = dq.clone(), dv = dq.clone();
  ops::AttnMask mask;  // causal
  const float scale = 1.f / std::sqrt(static_cast<float>(D));
  size_t saved_bytes = 0;
  auto step = [&] {
    ops::AttentionSaved saved;
    ops::attention_forward(impl, q, k, v, mask, scale, out, saved, Consumer::activations);
    saved_bytes = (saved.probs.defined() ? saved.probs.nbytes() : 0) + (saved.lse.defined() ? saved.lse.nbytes() : 0);
    ops::attention_backward(impl, q, k, v, out, g, mask, scale, saved, dq, dk, dv);
  };
#if HEADROOM_HAVE_CUDA
  if (kernel == ops::GpuAttentionKernel::cudnn) {
    // One step first, which builds the graphs: where cuDNN builds none for this
    // shape the scalar kernels would run, and be timed under cuDNN's name.
    const uint64_t ran = ops::cuda::cudnn_attention_executions();
    step();
    if (ops::cuda::cudnn_attention_executions() - ran != 2) {
      state.SkipWithError("cuDNN built no graph for this shape (see the log): the scalar kernels would run");
      return;
    }
  }
#endif
  dev.synchronize();
  const MemorySnapshot before = dev.memory().snapshot();
  dev.memory().reset_peak();
  run_timed(state, dev, step);
  const MemorySnapshot after = dev.memory().snapshot();
  state.counters["saved_bytes"] = benchmark::Counter(static_cast<double>(saved_bytes), {}, benchmark::Counter::kIs1024);
  state.counters["step_peak_bytes"] = benchmark::Counter(
      static_cast<double>(after.total_peak_bytes - before.total_current_bytes), {}, benchmark::Counter::kIs1024);
  // Model FLOPs: 2 products forward (4 B H T^2 D) and 4 backward (8 B H T^2 D),
  // halved for the causal mask; recomputation is not counted.
  set_flops(state, 6.0 * B * H * T * T * D);
  // Each direction's rate on its own, from up to 3 more steps under an op profile
  // (outside the timed ones, and within 0.2 s after the first), the median of
  // each: where a kernel falls short of its target, which half. The profile's
  // events add a little to each direction's time.
  std::map<std::string, std::vector<double>> seconds;
  const auto profiled0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 3 && (i == 0 || std::chrono::steady_clock::now() - profiled0 < std::chrono::milliseconds(200));
       ++i) {
    OpProfile profile;
    step();
    for (const auto& [op, s] : profile.take()) seconds[op].push_back(s);
  }
  const double bhttd = static_cast<double>(B) * H * T * T * D;
  for (const auto& [op, counter, flops] : {std::tuple{"attention_forward", "forward_FLOP/s", 2.0 * bhttd},
                                           std::tuple{"attention_backward", "backward_FLOP/s", 4.0 * bhttd}}) {
    const auto it = seconds.find(op);
    if (it == seconds.end()) continue;
    if (const double median = summarize_times(it->second).median_s; median > 0)
      state.counters[counter] = flops / median;
  }
}

void register_all() {
  for (DType dt : kFloatDTypes) {
    const std::string d = dtype_name(dt);
    hr::bench::register_case("matmul_cpu/" + d, bm_matmul, BackendKind::cpu, dt)
        ->Arg(64)
        ->Arg(256)
        ->UseRealTime()  // OpenBLAS threads: rates per wall second, not per main-thread CPU second
        ->Unit(benchmark::kMicrosecond);
  }
  for (auto impl : {ops::AttentionImpl::naive, ops::AttentionImpl::memory_efficient})
    hr::bench::register_case(std::string("attention_cpu/") + ops::attention_impl_name(impl), bm_attention,
                             BackendKind::cpu, impl, int64_t{1}, int64_t{2}, int64_t{32}, ops::GpuAttentionKernel::scalar,
                             true)
        ->Arg(64)
        ->Arg(256)
        ->UseRealTime()  // OpenBLAS threads: rates per wall second, not per main-thread CPU second
        ->Unit(benchmark::kMicrosecond);

  std::string why_not;
  if (!cuda_device_available(&why_not)) {
    std::fprintf(stderr, "bench_matmul: CUDA cases not registered: %s\n", why_not.c_str());
    return;
  }
#if HEADROOM_HAVE_CUDA
  for (DType dt : kFloatDTypes) {
    const std::string d = dtype_name(dt);
    hr::bench::register_case("matmul_cuda/" + d, bm_matmul, BackendKind::cuda, dt)
        ->RangeMultiplier(2)
        ->Range(256, 8192)
        ->UseManualTime()
        ->Unit(benchmark::kMillisecond);
    hr::bench::register_case("cublas_alone_cuda/" + d, bm_cublas_alone, dt)
        ->RangeMultiplier(2)
        ->Range(256, 8192)
        ->UseManualTime()
        ->Unit(benchmark::kMillisecond);
  }
  // Naive, memory-efficient with the scalar kernels, with cuDNN's fused attention
  // (a library kernel timed beside the own ones: its deterministic backward, which
  // the runs use, and at the longest length its non-deterministic one, the kind
  // FlashAttention-2's figures are of), and with the tensor-core kernels.
  struct Form {
    ops::AttentionImpl impl;
    ops::GpuAttentionKernel kernel;
    const char* name;
    bool cudnn_deterministic = true;
  };
  // Head dims 64 (8 heads) and 128 (4 heads): the same B H D, so the same FLOPs per T.
  const Form forms[] = {
      {ops::AttentionImpl::naive, ops::GpuAttentionKernel::scalar, "naive"},
      {ops::AttentionImpl::memory_efficient, ops::GpuAttentionKernel::scalar, "memory_efficient"},
      {ops::AttentionImpl::memory_efficient, ops::GpuAttentionKernel::cudnn, "memory_efficient_cudnn"},
      {ops::AttentionImpl::memory_efficient, ops::GpuAttentionKernel::cudnn, "memory_efficient_cudnn_nondeterministic",
       false},
      {ops::AttentionImpl::memory_efficient, ops::GpuAttentionKernel::tensor_core, "memory_efficient_tensor_core"}};
  // The tensor-core forms last: an error of kernels new to a device that leaves it
  // unusable (an illegal address) costs only the cases after it.
  // cuDNN's cases only where it runs (a library kernel that is optional: its absence
  // is said, not an error), and at three lengths: each shape builds two graphs in its
  // warm-up (seconds where cuDNN compiles its kernels at run time), which the GPU
  // check's time must hold.
  // Each cuDNN backward (deterministic, not) where its small graphs build.
  std::string no_cudnn[2];
  for (const bool deterministic : {false, true}) {
    const ops::cuda::ScopedCudnnDeterminism kind(deterministic);
    if (!ops::gpu_attention_kernel_available(device(BackendKind::cuda), ops::GpuAttentionKernel::cudnn, DType::bf16,
                                             64, &no_cudnn[deterministic]))
      std::fprintf(stderr, "bench_matmul: cuDNN attention cases (%s backward) not registered: %s\n",
                   deterministic ? "deterministic" : "non-deterministic", no_cudnn[deterministic].c_str());
  }
  // The micro-batch sweep's step shape (BM-MB at the full preset, micro-batch 32: 32
  // sequences of 1024 tokens, 16 heads of 64), where the series below, at 32 heads,
  // leave an H100's SMs part idle at T 1024: what attention costs inside that step.
  // Naive and cuDNN's first, the tensor-core kernels' after every other case.
  auto register_step_shape = [&](const Form& f) {
    if (f.kernel == ops::GpuAttentionKernel::scalar && f.impl == ops::AttentionImpl::memory_efficient) return;
    if (f.kernel == ops::GpuAttentionKernel::cudnn && (!f.cudnn_deterministic || !no_cudnn[1].empty())) return;
    hr::bench::register_case(std::string("attention_cuda_step/") + f.name, bm_attention, BackendKind::cuda, f.impl,
                             int64_t{32}, int64_t{16}, int64_t{64}, f.kernel, f.cudnn_deterministic)
        ->Arg(1024)
        ->UseManualTime()
        ->Unit(benchmark::kMillisecond);
  };
  for (const Form& f : forms)
    if (f.kernel != ops::GpuAttentionKernel::tensor_core) register_step_shape(f);
  for (const Form& f : forms)
    for (const int64_t D : {int64_t{64}, int64_t{128}}) {
      if (f.kernel == ops::GpuAttentionKernel::cudnn && !no_cudnn[f.cudnn_deterministic].empty()) continue;
      auto* c = hr::bench::register_case(
          (D == 64 ? std::string("attention_cuda/") : "attention_cuda_d" + std::to_string(D) + "/") + f.name,
          bm_attention, BackendKind::cuda, f.impl, int64_t{4}, int64_t{512} / D, D, f.kernel, f.cudnn_deterministic);
      if (f.kernel == ops::GpuAttentionKernel::cudnn && !f.cudnn_deterministic)
        c->Arg(8192);
      else if (f.kernel == ops::GpuAttentionKernel::cudnn)
        c->Arg(1024)->Arg(4096)->Arg(8192);
      else
        c->RangeMultiplier(2)->Range(512, 8192);
      c->UseManualTime()->Unit(benchmark::kMillisecond);
    }
  for (const Form& f : forms)
    if (f.kernel == ops::GpuAttentionKernel::tensor_core) register_step_shape(f);
#endif
}

}  // namespace
}  // namespace hr

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  hr::register_all();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
