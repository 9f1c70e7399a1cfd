// The scalar memory-efficient attention kernels of the GPU (kernels/attention/
// attention_kernels.cuh: a thread or a few per query or key row, fp32, fp16 and bf16, the
// form fp32 always takes and the fallback of the tensor-core kernels) run on
// emulated threads (suites/common/warp_emulation.hpp), so that their indexing,
// chunks, online-softmax steps, masks and early ends are checked on every machine,
// not only where a GPU runs the conformance cases. The forward is held to the
// float64 reference of OPS-1 and the backward to the float64 gradient from the
// definition (suites/common/attention_problem.hpp), under every mask, at each
// head-dim bucket and at head dims below their bucket's; each case runs under two
// schedules that must give the same bits (a missing barrier shows). The checks'
// controls are faults of the emulated hardware (emu::Fault): shared memory that
// reads back off, block barriers that let threads on, and a row's lanes that never
// meet in their shuffles.
#include <gtest/gtest.h>

#include <cmath>
#include <initializer_list>
#include <vector>

#include "harness/tolerances.hpp"
#include "kernels/common/float16.hpp"
#include "suites/common/attention_masks.hpp"
#include "suites/common/attention_problem.hpp"

#if HEADROOM_HAVE_CUDA
// Last: they define the CUDA names (threadIdx, __syncthreads, ...) on emulated threads.
#include "suites/common/attention_emulated.hpp"
#include "kernels/attention/attention_kernels.cuh"
#endif

namespace {

#if HEADROOM_HAVE_CUDA

using hr::bfloat16_t;
using hr::DType;
using hr::half_t;
using hr::test::attn::Case;
using hr::test::attn::Input;
using hr::test::attn::Inputs;
using hr::test::attn::inputs_for;
using hr::test::attn::KernelOutputs;
using hr::test::attn::make_problem;
using hr::test::attn::Problem;
using hr::test::attn::run_three;
using Mask = hr::test::MaskKind;

namespace ak = hr::ops::cuda::attn_kernels;
namespace emu = hr::warp_emu;

// The three kernels on emulated threads, launched as backward_launch and
// forward_launch launch them (one block per head and tile of kRows rows, of
// forward_threads or backward_threads, no dynamic shared memory).
template <typename S, int kD>
KernelOutputs run_kernels(const Problem& p, const Input& q, const Input& k, const Input& v, const Input& dout,
                          const emu::Schedule& schedule, const emu::Fault& fault) {
  const int fwd = ak::forward_threads<kD>(), bwd = ak::backward_threads<kD>();
  return run_three<S>(p, q, k, v, dout, ak::kRows, {fwd, bwd, bwd}, {0, 0, 0}, ak::mem_efficient_forward_kernel<S, kD>,
                      ak::mem_efficient_dq_kernel<S, kD>, ak::mem_efficient_dkv_kernel<S, kD>, schedule, fault);
}

// The kernels of the dtype and of the head-dim bucket that takes D, as the
// dispatcher picks them.
KernelOutputs run_for(DType dt, const Problem& p, const Input& q, const Input& k, const Input& v, const Input& g,
                      const emu::Schedule& schedule, const emu::Fault& fault) {
  return ak::with_head_dim(p.D, [&](auto kd) {
    constexpr int kD = decltype(kd)::value;
    switch (dt) {
      case DType::f32: return run_kernels<float, kD>(p, q, k, v, g, schedule, fault);
      case DType::f16: return run_kernels<half_t, kD>(p, q, k, v, g, schedule, fault);
      default: return run_kernels<bfloat16_t, kD>(p, q, k, v, g, schedule, fault);
    }
  });
}

void check(DType dt, std::initializer_list<Case> cases) { hr::test::attn::check_cases(run_for, dt, cases, 200); }

// Each bucket with its rows in tiles of 64 (three at T 130, two at 66-100; the last
// partial), its keys in chunks of 32 (the last partial) and, in the forward, in
// steps of 8 within a chunk, which a causal or padded row leaves early; a row's
// threads one, two (the forward at 128, the backward at 64) and four (the backward
// at 128); head dims below their bucket's (40 of 64, 100 of 128, 20 of 32, 3 of 32)
// and a few rows (T 3).
TEST(AttentionScalarEmulated, Fp32MatchesFloat64UnderEveryMask) {
  check(DType::f32, {Case{130, 64}, Case{130, 32}, Case{70, 128}, Case{66, 40}});
}
TEST(AttentionScalarEmulated, Bf16MatchesFloat64UnderEveryMask) {
  check(DType::bf16, {Case{130, 64}, Case{100, 32}, Case{66, 100}, Case{3, 3}});
}
TEST(AttentionScalarEmulated, Fp16MatchesFloat64UnderEveryMask) {
  check(DType::f16, {Case{130, 64}, Case{70, 128}, Case{45, 20}});
}

// Key lengths alone and with the causal mask, one of them 0 (check_key_length_cases).
TEST(AttentionScalarEmulated, KeyLengthsAloneAndZeroMatchFloat64) {
  hr::test::attn::check_key_length_cases(run_for, {DType::f32, DType::bf16, DType::f16}, 300);
}

// The controls of the checks above, each made by a fault of the emulated hardware
// the kernels run on. Shared memory whose floats read back off by a relative r
// (Fault::shared_rel_error) is the control of the float64 checks of the output and
// of each gradient: grossly at r = 1 (every other value doubled, the rest zero),
// subtly at r = sqrt(12 x bound) for the output and sqrt(5.5 x bound) for the
// gradients, which land each NMSE 10-100x over its dtype's bound (the keys' and
// values' errors reach the output through a weighted mean, and the gradients of
// the keys through the staged log-sum-exps too). Block barriers that let threads
// on are the control of the check that both schedules give the same bits: every
// barrier, grossly, and only the second of each thread (after the first chunk is
// staged), subtly.
TEST(AttentionScalarEmulated, HardwareFaultsFailTheChecks) {
  auto shared_off = [](double r) {
    emu::Fault f;
    f.shared_rel_error = r;
    return f;
  };
  auto barrier_skipped = [](int n) {
    emu::Fault f;
    f.skip_block_barrier = n;
    return f;
  };
  for (const DType dt : {DType::f32, DType::bf16, DType::f16}) {
    const Problem p = make_problem(2, 1, 130, 64, Mask::causal);
    const Inputs x = inputs_for(p, dt, 41);
    const double r_fwd = std::sqrt(12 * hr::tol::kAttentionNmse(dt)), r_bwd = std::sqrt(5.5 * hr::tol::kAttentionGradNmse(dt));
    hr::test::attn::expect_value_faults_caught(run_for, dt, p, x,
                                               {{shared_off(1.0), 1.0, true, true},
                                                {shared_off(r_fwd), r_fwd, true, false},
                                                {shared_off(r_bwd), r_bwd, false, true}});
    hr::test::attn::expect_order_faults_caught(
        run_for, dt, p, x, {{"every_block_barrier", barrier_skipped(-1)}, {"block_barrier_2", barrier_skipped(2)}});
  }
}

// Where a row has several threads its dot products are summed over them by
// shuffles (row_sum): a shuffle that gives each lane its own value
// (Fault::stuck_shuffle_mask) is the control that the float64 checks see a row whose
// threads do not meet. At head dim 128 the first level of the sum (lane mask 1) is in
// every kernel, the second (mask 2) only in the backward's, whose rows have four
// threads; at 64 the backward's rows have two.
TEST(AttentionScalarEmulated, ARowsThreadsThatDoNotMeetFailTheChecks) {
  auto stuck = [](int mask) {
    emu::Fault f;
    f.stuck_shuffle_mask = mask;
    return f;
  };
  for (const DType dt : {DType::f32, DType::bf16}) {
    const Problem p128 = make_problem(2, 1, 70, 128, Mask::causal), p64 = make_problem(2, 1, 70, 64, Mask::causal);
    const Inputs x128 = inputs_for(p128, dt, 43), x64 = inputs_for(p64, dt, 47);
    hr::test::attn::expect_value_faults_caught(
        run_for, dt, p128, x128,
        {{stuck(1), 1.0, true, true, "shuffle_1_stuck_d128"}, {stuck(2), 1.0, false, true, "shuffle_2_stuck_d128"}});
    hr::test::attn::expect_value_faults_caught(run_for, dt, p64, x64,
                                               {{stuck(1), 1.0, false, true, "shuffle_1_stuck_d64"}});
  }
}

// The emulation's own pieces these kernels' checks rest on. The vote (__any_sync)
// gives every lane true where one lane passes, and false where none does. The
// shared-memory fault reaches static arrays of float and float4, 1 + r and 1 - r by
// turns, and leaves an int array as stored (as it leaves a struct, such as the 8-bit
// optimizers' codebooks).
TEST(AttentionScalarEmulated, TheVoteAndTheSharedMemoryFaultActAsDefined) {
  for (const int one : {-1, 0, 17, 31}) {
    int said_yes = 0;
    emu::launch(dim3(1), 32, 0, [&] {
      if (__any_sync(0xffffffffu, static_cast<int>(threadIdx.x) == one)) ++said_yes;
    });
    EXPECT_EQ(said_yes, one < 0 ? 0 : 32) << "lane " << one << " alone passing";
  }
  emu::Fault off;
  off.shared_rel_error = 0.25;
  float fl[2] = {}, v4[4] = {};
  int in[2] = {};
  emu::launch(
      dim3(1), 32, 0,
      [&] {
        HR_SHARED(float[2], fs);
        HR_SHARED(float4[1], f4s);
        HR_SHARED(int[2], is);
        if (threadIdx.x == 0) {
          fs[0] = fs[1] = 8.f;
          f4s[0] = make_float4(8.f, 8.f, 8.f, 8.f);
          is[0] = is[1] = 1000;
        }
        __syncthreads();
        if (threadIdx.x == 0) {
          fl[0] = fs[0], fl[1] = fs[1];
          v4[0] = f4s[0].x, v4[1] = f4s[0].y, v4[2] = f4s[0].z, v4[3] = f4s[0].w;
          in[0] = is[0], in[1] = is[1];
        }
      },
      {}, off);
  EXPECT_EQ(fl[0], 10.f);
  EXPECT_EQ(fl[1], 6.f);
  EXPECT_EQ((std::vector<float>(v4, v4 + 4)), (std::vector<float>{10.f, 6.f, 10.f, 6.f}));
  EXPECT_EQ(in[0], 1000);
  EXPECT_EQ(in[1], 1000);
}

#else

TEST(AttentionScalarEmulated, KernelsRunOnEmulatedThreads) {
  GTEST_SKIP() << "built without the CUDA toolkit: the kernels' headers are not here";
}

#endif

}  // namespace
