// The CUDA kernels of the 8-bit optimizer state (kernels/optim/optim8_kernels.cuh)
// run on emulated warps (suites/common/warp_emulation.hpp), held to the CPU's
// adamw8bit_step, quantize_blockwise and dequantize_blockwise bit for bit, as the
// GPU's are (OptimMany.*/cuda, Optim8bit*): the same q8::adamw8 and q8::quantize
// per element, so any difference is the kernels' indexing, tails, block reductions
// or the many-tensor launches' packing. Each case runs under two schedules (warps
// one at a time, from the first and from the last). The controls are faults of the
// emulated hardware: shuffles that give a lane its own value, and a block barrier
// (the one that publishes the codebooks) that lets its threads on.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <cstdint>
#include <string>
#include <vector>

#include "harness/device.hpp"
#include "harness/tensor.hpp"
#include "kernels/common/dtype_dispatch.hpp"
#include "kernels/optim/optim8.hpp"
#include "suites/common/test_support.hpp"

#if HEADROOM_HAVE_CUDA
// Last: it defines the CUDA names (threadIdx, __syncthreads, ...) on emulated threads.
#include "suites/common/warp_emulation.hpp"
#include "kernels/optim/optim8_kernels.cuh"
#endif

namespace {

using hr::DType;
using hr::Tensor;

#if HEADROOM_HAVE_CUDA

namespace emu = hr::warp_emu;
namespace q8k = hr::ops::cuda::q8k;

const emu::Schedule kSchedules[] = {
    {emu::Schedule::Warps::one_at_a_time, emu::Schedule::Copies::at_issue},
    {emu::Schedule::Warps::one_at_a_time_reversed, emu::Schedule::Copies::at_issue}};

// One tensor's step arguments on the CPU: its state quantised from random moments
// by the CPU's own quantiser, so codes and absmax are ones a run holds.
struct State8 {
  Tensor param, grad, mq, ma, vq, va;
  State8 clone() const { return {param.clone(), grad.clone(), mq.clone(), ma.clone(), vq.clone(), va.clone()}; }
  std::vector<std::vector<uint8_t>> bytes() const {
    return {param.to_host_bytes(), mq.to_host_bytes(), ma.to_host_bytes(), vq.to_host_bytes(), va.to_host_bytes()};
  }
};
State8 make_state(hr::Device& dev, DType tp, DType tg, int64_t n, int64_t block, uint64_t seed) {
  using hr::Consumer;
  const auto N = static_cast<size_t>(n);
  State8 s;
  s.param = Tensor::from_host(dev, hr::test::random_nonzero(N, seed, -1.f, 1.f), {n}, tp, Consumer::weights);
  s.grad = Tensor::from_host(dev, hr::test::random_nonzero(N, seed + 1, -0.1f, 0.1f), {n}, tg, Consumer::gradients);
  const Tensor m = Tensor::from_host(dev, hr::test::random_nonzero(N, seed + 2, -1e-2f, 1e-2f), {n}, DType::f32,
                                     Consumer::optimizer_state);
  const Tensor v = Tensor::from_host(dev, hr::test::random_nonzero(N, seed + 3, 1e-6f, 1e-4f), {n}, DType::f32,
                                     Consumer::optimizer_state);
  const int64_t blocks = hr::q8::block_count(n, block);
  s.mq = Tensor::empty(dev, {n}, DType::u8, Consumer::optimizer_state);
  s.vq = Tensor::empty(dev, {n}, DType::u8, Consumer::optimizer_state);
  s.ma = Tensor::empty(dev, {blocks}, DType::f32, Consumer::optimizer_state);
  s.va = Tensor::empty(dev, {blocks}, DType::f32, Consumer::optimizer_state);
  hr::ops::quantize_blockwise(m, s.mq, s.ma, block, hr::q8::MapKind::dynamic_signed);
  hr::ops::quantize_blockwise(v, s.vq, s.va, block, hr::q8::MapKind::dynamic_unsigned);
  return s;
}

hr::ops::AdamWConfig config(float weight_decay) {
  hr::ops::AdamWConfig c;
  c.lr = 1e-3f;
  c.weight_decay = weight_decay;
  return c;
}
constexpr int64_t kStep = 3;

// The maps in the emulated device's slots 0 (first moment) and 1 (second), as
// codebook_slot uploads them.
const q8k::MapSlots kMaps{0, 1};
void put_codebooks() {
  q8k::g_codebooks[0] = hr::q8::make_codebook(hr::q8::MapKind::dynamic_signed);
  q8k::g_codebooks[1] = hr::q8::make_codebook(hr::q8::MapKind::dynamic_unsigned);
}

// One step of s on emulated warps: the tiled kernel, or the one of a thread block
// per quantisation block.
void emulated_step(State8& s, int64_t block, float weight_decay, bool tiled, const emu::Schedule& schedule,
                   const emu::Fault& fault = {}) {
  put_codebooks();
  const hr::ops::AdamWConfig c = config(weight_decay);
  const hr::optim::AdamWScalars sc = hr::optim::adamw_scalars(c.lr, c.beta1, c.beta2, c.eps, c.weight_decay, kStep);
  const int64_t n = s.param.numel();
  hr::dispatch_float2(s.param.dtype(), s.grad.dtype(), "emulated_step", [&](auto tp, auto tg) {
    using TP = decltype(tp);
    using TG = decltype(tg);
    TP* p = s.param.data_as<TP>();
    const TG* g = s.grad.data_as<TG>();
    uint8_t* mq = s.mq.data_as<uint8_t>();
    uint8_t* vq = s.vq.data_as<uint8_t>();
    float* ma = s.ma.data_as<float>();
    float* va = s.va.data_as<float>();
    if (tiled) {
      ASSERT_TRUE(q8k::tiles(block, p, g, mq, vq)) << "block " << block << " does not take the tiled kernel";
      emu::launch(
          dim3(q8k::tiled_grid(n)), q8k::kTileThreads, 0,
          [&] { q8k::adamw8_tiled_kernel<TP, TG>(p, g, mq, ma, vq, va, n, static_cast<int>(block), kMaps, sc); },
          schedule, fault);
    } else {
      emu::launch(
          dim3(static_cast<unsigned>(s.ma.numel())), q8k::kQ8Threads, 0,
          [&] { q8k::adamw8_kernel<TP, TG>(p, g, mq, ma, vq, va, n, block, kMaps, sc); }, schedule, fault);
    }
  });
}

// The CPU's step of s (the reference).
void cpu_step(State8& s, int64_t block, float weight_decay) {
  hr::ops::AdamW8bitOptions opt;
  opt.block_size = block;
  hr::ops::adamw8bit_step(s.param, s.grad, s.mq, s.ma, s.vq, s.va, kStep, config(weight_decay), opt);
}

// How many bytes of the five outputs (parameter, codes, absmax) differ.
size_t bytes_differing(const State8& a, const State8& b) {
  const auto x = a.bytes(), y = b.bytes();
  size_t n = 0;
  for (size_t k = 0; k < x.size(); ++k)
    for (size_t i = 0; i < x[k].size(); ++i) n += x[k][i] != y[k][i];
  return n;
}

struct Case {
  DType param, grad;
  int64_t n, block;
};
std::string name_of(const Case& c) {
  return fmt::format("{}/{} n {} block {}", hr::dtype_name(c.param), hr::dtype_name(c.grad), c.n, c.block);
}

void check_step(const Case& c, bool tiled, uint64_t seed) {
  hr::Device& dev = hr::test::cpu_device();
  const State8 start = make_state(dev, c.param, c.grad, c.n, c.block, seed);
  State8 want = start.clone();
  cpu_step(want, c.block, 0.01f);
  for (const emu::Schedule& schedule : kSchedules) {
    State8 got = start.clone();
    emulated_step(got, c.block, 0.01f, tiled, schedule);
    EXPECT_EQ(bytes_differing(got, want), 0u)
        << name_of(c) << (tiled ? ", tiled" : ", a thread block per block") << ", warps "
        << (schedule.warps == emu::Schedule::Warps::one_at_a_time ? "first to last" : "last to first");
  }
}

// The tiled kernel (a power-of-two block of 8 to 2048, a tile of 2048 elements, 8 a
// thread): the block's absmax by shuffles alone (8-256) or through the barrier
// (512, 2048); tails inside a thread's 8, a block and a tile; fewer elements than
// one thread takes; the parameter and gradient dtypes a run steps (fp32 gradients
// of fp32 masters or of 16-bit parameters) and 16-bit gradients.
TEST(Optim8bitEmulated, TiledKernelMatchesTheCpuBitForBit) {
  uint64_t seed = 300;
  for (const Case& c : {Case{DType::f32, DType::f32, 5000, 256}, Case{DType::f32, DType::f32, 6147, 2048},
                        Case{DType::f32, DType::f32, 4099, 8}, Case{DType::f32, DType::f32, 7, 64},
                        Case{DType::bf16, DType::f32, 5000, 256}, Case{DType::f16, DType::f32, 4103, 2048},
                        Case{DType::bf16, DType::bf16, 3000, 256}, Case{DType::f32, DType::bf16, 4096, 512},
                        Case{DType::f16, DType::f16, 2053, 128}})
    check_step(c, true, seed += 4);
}

// The kernel of one thread block per quantisation block, for the blocks the tiled
// kernel does not take (not a power of two, or past 2048): two passes over the
// block, the absmax reduced through shared memory between them.
TEST(Optim8bitEmulated, PerBlockKernelMatchesTheCpuBitForBit) {
  uint64_t seed = 400;
  for (const Case& c : {Case{DType::f32, DType::f32, 1000, 100}, Case{DType::f32, DType::f32, 9000, 4096},
                        Case{DType::bf16, DType::f32, 777, 256}, Case{DType::f16, DType::f32, 1001, 300},
                        Case{DType::f16, DType::bf16, 33, 5}})
    check_step(c, false, seed += 4);
}

// The many-tensor launches: 44 tensors (5 empty, tails, several tiles, 5 weight
// decays), their arguments made and packed as the GPU's launches make and pack them
// (q8_arg, for_each_q8_launch) into more than one launch of 36, each tile finding
// its tensor by the binary search; every tensor as the CPU steps it alone, under
// each schedule.
TEST(Optim8bitEmulated, ManyTensorLaunchesMatchTheCpuBitForBit) {
  hr::Device& dev = hr::test::cpu_device();
  const int64_t block = 256;
  std::vector<State8> start, want;
  const int64_t sizes[] = {0, 1, 7, 8, 255, 256, 2047, 2048, 2049, 5000};
  for (int i = 0; i < 44; ++i) {
    start.push_back(make_state(dev, DType::f32, DType::f32, sizes[i % 10] + 3 * (i / 10) * (sizes[i % 10] > 0), block,
                               500 + 4 * static_cast<uint64_t>(i)));
    want.push_back(start.back().clone());
  }
  const hr::ops::AdamWConfig base = config(0.f);
  std::vector<float> decay;
  for (size_t i = 0; i < want.size(); ++i) {
    decay.push_back(0.001f * static_cast<float>(i % 5));
    cpu_step(want[i], block, decay.back());
  }
  for (const emu::Schedule& schedule : kSchedules) {
    put_codebooks();
    std::vector<State8> got;
    std::vector<q8k::Q8TensorArg> args;
    for (size_t i = 0; i < start.size(); ++i) {
      got.push_back(start[i].clone());
      State8& s = got.back();
      ASSERT_TRUE(q8k::tiles(block, s.param.data(), s.grad.data(), s.mq.data(), s.vq.data())) << "tensor " << i;
      args.push_back(q8k::q8_arg(hr::ops::cuda::AdamW8bitArgs{
          &s.param, &s.grad, &s.mq, &s.ma, &s.vq, &s.va,
          hr::optim::adamw_scalars(base.lr, base.beta1, base.beta2, base.eps, decay[i], kStep)}));
    }
    int launches = 0;
    q8k::for_each_q8_launch(args, [&](const q8k::Q8Launch& L) {
      ++launches;
      emu::launch(
          dim3(static_cast<unsigned>(L.start[L.count])), q8k::kTileThreads, 0,
          [&] { q8k::adamw8_multi_kernel<float, float>(L, static_cast<int>(block), kMaps); }, schedule);
    });
    EXPECT_EQ(launches, 2) << "39 tensors with elements, in launches of " << q8k::kQ8MaxTensorsPerLaunch;
    for (size_t i = 0; i < got.size(); ++i)
      EXPECT_EQ(bytes_differing(got[i], want[i]), 0u) << "tensor " << i << " of " << got[i].param.numel();
  }
}

// quantize_blockwise's and dequantize_blockwise's kernels, as the CPU's.
TEST(Optim8bitEmulated, QuantizeAndDequantizeMatchTheCpuBitForBit) {
  hr::Device& dev = hr::test::cpu_device();
  put_codebooks();
  for (const int64_t block : {int64_t{64}, int64_t{100}, int64_t{2048}}) {
    const int64_t n = 5001;
    const Tensor x = Tensor::from_host(dev, hr::test::random_nonzero(static_cast<size_t>(n), 600 + block), {n},
                                       DType::f32, hr::Consumer::optimizer_state);
    const int64_t blocks = hr::q8::block_count(n, block);
    Tensor want_q = Tensor::empty(dev, {n}, DType::u8, hr::Consumer::optimizer_state), got_q = want_q.clone();
    Tensor want_a = Tensor::empty(dev, {blocks}, DType::f32, hr::Consumer::optimizer_state), got_a = want_a.clone();
    hr::ops::quantize_blockwise(x, want_q, want_a, block, hr::q8::MapKind::dynamic_signed);
    Tensor want_x = Tensor::empty(dev, {n}, DType::f32, hr::Consumer::optimizer_state), got_x = want_x.clone();
    hr::ops::dequantize_blockwise(want_q, want_a, want_x, block, hr::q8::MapKind::dynamic_signed);
    for (const emu::Schedule& schedule : kSchedules) {
      emu::launch(
          dim3(static_cast<unsigned>(blocks)), q8k::kQ8Threads, 0,
          [&] {
            q8k::quantize_kernel(x.data_as<float>(), got_q.data_as<uint8_t>(), got_a.data_as<float>(), n, block, 0);
          },
          schedule);
      EXPECT_EQ(got_q.to_host_bytes(), want_q.to_host_bytes()) << "codes, block " << block;
      EXPECT_EQ(got_a.to_host_bytes(), want_a.to_host_bytes()) << "absmax, block " << block;
      emu::launch(
          dim3(4), 256, 0,  // a grid-stride loop over more elements than the grid's threads
          [&] {
            q8k::dequantize_kernel(want_q.data_as<uint8_t>(), want_a.data_as<float>(), got_x.data_as<float>(), n,
                                   block, 0);
          },
          schedule);
      EXPECT_EQ(got_x.to_host_bytes(), want_x.to_host_bytes()) << "dequantised, block " << block;
    }
  }
}

// The controls: a block's absmax reduced by broken shuffles, every shuffle giving
// a lane its own value (gross) or only the one across half-warps (subtle: a block
// of 256 elements is 32 threads of 8, whose two halves then keep their own
// maximum); and the first block barrier, which publishes the codebooks, letting
// its threads on (shared memory is 0xff bytes at each block, so a thread reads a
// codebook entry another has not written yet). In both kernels, each check above
// then sees other bytes.
TEST(Optim8bitEmulated, HardwareFaultsFailTheChecks) {
  hr::Device& dev = hr::test::cpu_device();
  for (const bool tiled : {true, false}) {
    const Case c{DType::f32, DType::f32, 5000, 256};
    const State8 start = make_state(dev, c.param, c.grad, c.n, c.block, 700);
    State8 want = start.clone();
    cpu_step(want, c.block, 0.01f);
    struct Control {
      const char* what;
      emu::Fault fault;
    };
    for (const Control& x : {Control{"every_shuffle_stuck", emu::Fault{0, 0, 0, -1}},
                             Control{"half_warp_shuffle_stuck", emu::Fault{0, 0, 0, 16}},
                             Control{"codebook_barrier_skipped", emu::Fault{0, 1, 0, 0}}}) {
      State8 got = start.clone();
      emulated_step(got, c.block, 0.01f, tiled, kSchedules[1], x.fault);
      const size_t differ = bytes_differing(got, want);
      EXPECT_GT(differ, 0u) << (tiled ? "tiled" : "per block") << ": " << x.what << ", the same bytes";
      testing::Test::RecordProperty(fmt::format("{}_bytes_differing_{}", tiled ? "tiled" : "per_block", x.what),
                                    fmt::format("{}", differ));
    }
  }
}

#else

TEST(Optim8bitEmulated, KernelsRunOnEmulatedWarps) {
  GTEST_SKIP() << "built without the CUDA toolkit: the kernels' headers are not here";
}

#endif

}  // namespace
