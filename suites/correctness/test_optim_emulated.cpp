// The CUDA kernels of the fp32-state optimizers (kernels/optim/optim_kernels.cuh)
// run on emulated warps (suites/common/warp_emulation.hpp), held to the CPU's
// adamw_step and sgd_step bit for bit, as the GPU's are (OptimMany.*/cuda,
// OpsOptim.*): the same optim::adamw and optim::sgd per element, so any difference
// is the kernels' packs, tails and grid-stride loops, or the many-tensor launches'
// chunks, binary search and packing. The controls are a fault of the emulated
// hardware: threads of a block that never run (all but the first warp, grossly;
// the last thread, subtly).
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <cstdint>
#include <string>
#include <vector>

#include "harness/device.hpp"
#include "harness/tensor.hpp"
#include "kernels/common/dtype_dispatch.hpp"
#include "kernels/optim/optim.hpp"
#include "suites/common/test_support.hpp"

#if HEADROOM_HAVE_CUDA
// Last: it defines the CUDA names (threadIdx, __syncthreads, ...) on emulated threads.
#include "suites/common/warp_emulation.hpp"
#include "kernels/optim/optim_kernels.cuh"
#endif

namespace {

using hr::DType;
using hr::Tensor;

#if HEADROOM_HAVE_CUDA

namespace emu = hr::warp_emu;
namespace optk = hr::ops::cuda::optk;

constexpr int64_t kStep = 4;

// One tensor's AdamW arguments on the CPU, from random values (moments as a few
// steps leave them: m of either sign, v positive).
struct State {
  Tensor param, grad, m, v;
  State clone() const { return {param.clone(), grad.clone(), m.clone(), v.clone()}; }
};
State make_state(DType tp, DType tg, int64_t n, uint64_t seed) {
  const auto N = static_cast<size_t>(n);
  using hr::Consumer;
  return {Tensor::from_host(hr::test::cpu_device(), hr::test::random_nonzero(N, seed, -1.f, 1.f), {n}, tp, Consumer::weights),
          Tensor::from_host(hr::test::cpu_device(), hr::test::random_nonzero(N, seed + 1, -0.1f, 0.1f), {n}, tg, Consumer::gradients),
          Tensor::from_host(hr::test::cpu_device(), hr::test::random_nonzero(N, seed + 2, -1e-2f, 1e-2f), {n}, DType::f32,
                            Consumer::optimizer_state),
          Tensor::from_host(hr::test::cpu_device(), hr::test::random_nonzero(N, seed + 3, 1e-6f, 1e-4f), {n}, DType::f32,
                            Consumer::optimizer_state)};
}

// How many bytes of parameter and moments differ.
size_t bytes_differing(const State& a, const State& b) {
  size_t n = 0;
  for (const auto& [x, y] : {std::pair{&a.param, &b.param}, std::pair{&a.m, &b.m}, std::pair{&a.v, &b.v}}) {
    const auto bx = x->to_host_bytes(), by = y->to_host_bytes();
    for (size_t i = 0; i < bx.size(); ++i) n += bx[i] != by[i];
  }
  return n;
}

hr::ops::AdamWConfig config(float weight_decay) {
  hr::ops::AdamWConfig c;
  c.weight_decay = weight_decay;
  return c;
}
hr::optim::AdamWScalars scalars(float weight_decay) {
  const hr::ops::AdamWConfig c = config(weight_decay);
  return hr::optim::adamw_scalars(c.lr, c.beta1, c.beta2, c.eps, c.weight_decay, kStep);
}

// The per-tensor AdamW kernel in 4-element packs (and a tail) or element by
// element, over a grid smaller than the tensor (each thread loops), as the CPU
// steps it: the dtypes a run steps (fp32 gradients of fp32 masters or of 16-bit
// parameters) and 16-bit gradients.
TEST(OptimEmulated, AdamWKernelMatchesTheCpuBitForBit) {
  uint64_t seed = 800;
  for (const int64_t n : {int64_t{4099}, int64_t{3}})
    for (const auto& [tp, tg] : {std::pair{DType::f32, DType::f32}, std::pair{DType::bf16, DType::f32},
                                 std::pair{DType::f16, DType::f32}, std::pair{DType::bf16, DType::bf16},
                                 std::pair{DType::f32, DType::f16}}) {
      const State start = make_state(tp, tg, n, seed += 4);
      State want = start.clone();
      hr::ops::adamw_step(want.param, want.grad, want.m, want.v, kStep, config(0.01f));
      for (const bool packs : {true, false}) {
        State got = start.clone();
        hr::dispatch_float2(tp, tg, "test", [&](auto a, auto b) {
          using TP = decltype(a);
          using TG = decltype(b);
          auto run = [&](auto kernel) {
            emu::launch(dim3(3), 64, 0, [&] {
              kernel(got.param.data_as<TP>(), got.grad.data_as<TG>(), got.m.data_as<float>(), got.v.data_as<float>(),
                     n, scalars(0.01f));
            });
          };
          if (packs)
            run(optk::adamw_kernel<4, TP, TG>);
          else
            run(optk::adamw_kernel<1, TP, TG>);
        });
        EXPECT_EQ(bytes_differing(got, want), 0u) << hr::dtype_name(tp) << "/" << hr::dtype_name(tg) << " n " << n
                                                  << (packs ? ", packs of 4" : ", element by element");
      }
    }
}

// The kernels' grid-stride loops given threads that never run (the first warp
// alone, or all but the last thread, of 64): the elements those threads own stay
// as they were, and the checks above see it.
TEST(OptimEmulated, LostThreadsFailTheChecks) {
  const int64_t n = 4099;
  const State start = make_state(DType::f32, DType::f32, n, 850);
  State want = start.clone();
  hr::ops::adamw_step(want.param, want.grad, want.m, want.v, kStep, config(0.01f));
  for (const int run : {32, 63}) {
    for (const bool packs : {true, false}) {
      State got = start.clone();
      emu::launch(
          dim3(3), 64, 0,
          [&] {
            float* p = got.param.data_as<float>();
            const float* g = got.grad.data_as<float>();
            if (packs)
              optk::adamw_kernel<4, float, float>(p, g, got.m.data_as<float>(), got.v.data_as<float>(), n, scalars(0.01f));
            else
              optk::adamw_kernel<1, float, float>(p, g, got.m.data_as<float>(), got.v.data_as<float>(), n, scalars(0.01f));
          },
          {}, emu::Fault{0, 0, 0, 0, run});
      const size_t differ = bytes_differing(got, want);
      EXPECT_GT(differ, 0u) << run << " of 64 threads ran and every element stepped";
      testing::Test::RecordProperty(fmt::format("bytes_differing_{}_threads_{}", run, packs ? "packs" : "elements"),
                                    fmt::format("{}", differ));
    }
  }
}

// SGD with and without momentum, in packs and element by element.
TEST(OptimEmulated, SgdKernelMatchesTheCpuBitForBit) {
  for (const float momentum : {0.f, 0.9f}) {
    const int64_t n = 1031;
    const State start = make_state(DType::f32, DType::f32, n, 900);
    hr::ops::SgdConfig cfg;
    cfg.momentum = momentum;
    cfg.weight_decay = 1e-4f;
    State want = start.clone();
    hr::ops::sgd_step(want.param, want.grad, want.m, cfg);
    const hr::optim::SgdScalars s{cfg.lr, cfg.momentum, cfg.weight_decay, cfg.momentum != 0.f};
    for (const bool packs : {true, false}) {
      State got = start.clone();
      float* buf = momentum != 0.f ? got.m.data_as<float>() : nullptr;
      emu::launch(dim3(2), 64, 0, [&] {
        if (packs)
          optk::sgd_kernel<4, float, float>(got.param.data_as<float>(), got.grad.data_as<float>(), buf, n, s);
        else
          optk::sgd_kernel<1, float, float>(got.param.data_as<float>(), got.grad.data_as<float>(), buf, n, s);
      });
      EXPECT_EQ(bytes_differing(got, want), 0u) << "momentum " << momentum << (packs ? ", packs" : ", elements");
    }
  }
}

// The many-tensor launches of 4096-element chunks: 55 tensors (6 empty, tails in
// a pack, a chunk and past several chunks, 4 weight decays), their arguments made
// and packed as the GPU's launches make and pack them (adamw_arg,
// for_each_adamw_launch) into two launches of up to 48, each chunk finding its
// tensor by the binary search; every tensor as the CPU steps it alone. Blocks
// that run their first warp alone are the control.
TEST(OptimEmulated, ManyTensorLaunchesMatchTheCpuBitForBit) {
  const int64_t sizes[] = {0, 1, 3, 4, 5, 1023, 4096, 4097, 9000, 12289};
  std::vector<State> start, want;
  std::vector<float> decay;
  for (int i = 0; i < 55; ++i) {
    const int64_t n = sizes[i % 10] + (sizes[i % 10] > 0 ? i / 10 : 0);
    start.push_back(make_state(DType::bf16, DType::f32, n, 1000 + 4 * static_cast<uint64_t>(i)));
    decay.push_back(0.002f * static_cast<float>(i % 4));
    want.push_back(start.back().clone());
    hr::ops::adamw_step(want.back().param, want.back().grad, want.back().m, want.back().v, kStep, config(decay.back()));
  }
  for (const bool whole_blocks : {true, false}) {
    std::vector<State> got;
    std::vector<optk::AdamWTensorArg> args;
    for (size_t i = 0; i < start.size(); ++i) {
      got.push_back(start[i].clone());
      State& s = got.back();
      ASSERT_TRUE(optk::packs_of_4(s.param, s.grad, s.m, s.v)) << "tensor " << i;
      args.push_back(optk::adamw_arg(hr::ops::cuda::AdamWArgs{&s.param, &s.grad, &s.m, &s.v, scalars(decay[i])}));
    }
    int launches = 0;
    optk::for_each_adamw_launch(args, [&](const optk::AdamWLaunch& L) {
      ++launches;
      emu::launch(
          dim3(static_cast<unsigned>(L.start[L.count])), optk::kThreads, 0,
          [&] { optk::adamw_multi_kernel<hr::bfloat16_t, float>(L); }, {}, emu::Fault{0, 0, 0, 0, whole_blocks ? 0 : 32});
    });
    EXPECT_EQ(launches, 2) << "49 tensors with elements, in launches of " << optk::kAdamWMaxTensorsPerLaunch;
    size_t differ = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      const size_t d = bytes_differing(got[i], want[i]);
      differ += d;
      if (whole_blocks) EXPECT_EQ(d, 0u) << "tensor " << i << " of " << got[i].param.numel();
    }
    if (!whole_blocks) {
      EXPECT_GT(differ, 0u) << "blocks of one warp stepped every element";
      testing::Test::RecordProperty("bytes_differing_one_warp_blocks", fmt::format("{}", differ));
    }
  }
}

#else

TEST(OptimEmulated, KernelsRunOnEmulatedWarps) {
  GTEST_SKIP() << "built without the CUDA toolkit: the kernels' headers are not here";
}

#endif

}  // namespace
