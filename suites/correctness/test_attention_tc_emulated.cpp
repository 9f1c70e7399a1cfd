// The tensor-core attention kernels' own code
// (kernels/attention/attention_tc_kernels.cuh) run on emulated warps
// (suites/common/warp_emulation.hpp), so that their indexing, fragments, masks,
// pipelines and arithmetic are checked on every machine, not only where a GPU runs the
// conformance cases (Cuda/AttentionTensorCore.*). The forward is held to the float64
// reference of OPS-1, the backward to a float64 gradient computed from the definition
// with its own mask predicate (suites/common/attention_problem.hpp), itself held here
// to finite differences of the reference on a small shape. Shapes cross the tiles'
// edges and take the steps wholly inside the allowed keys (which skip the per-element
// mask test) and the others, under every mask, at each head-dim bucket; each runs
// under two schedules that must give the same bits (a missing barrier or cp.async wait
// shows), and the ldmatrix loads and cp.async writes are held free of bank conflicts.
// The checks' controls are faults of the emulated hardware (emu::Fault).
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <string>
#include <vector>

#include "harness/tolerances.hpp"
#include "kernels/attention/attention_ref.hpp"
#include "kernels/common/float16.hpp"
#include "suites/common/attention_masks.hpp"
#include "suites/common/attention_problem.hpp"
#include "suites/common/finite_diff.hpp"
#include "suites/common/op_check.hpp"
#include "suites/common/test_support.hpp"

#if HEADROOM_HAVE_CUDA
// Last: it defines the CUDA names (threadIdx, __syncthreads, ...) on emulated threads.
#include "suites/common/attention_emulated.hpp"
#include "kernels/attention/attention_tc_kernels.cuh"
#endif

namespace {

using hr::bfloat16_t;
using hr::DType;
using hr::half_t;

using hr::test::kAllMasks;
using hr::test::mask_name;
using hr::test::attn::Grads;
using hr::test::attn::Input;
using hr::test::attn::make_problem;
using hr::test::attn::Problem;
using hr::test::attn::random_input;
using hr::test::attn::reference_backward;
using hr::test::attn::widen;
using Mask = hr::test::MaskKind;

// The float64 gradient of this file against central finite differences of the
// float64 forward reference: the oracle of the backward checks below is right.
TEST(AttentionTensorCoreEmulated, TheBackwardReferenceMatchesFiniteDifferences) {
  for (Mask mk : kAllMasks) {
    const Problem p = make_problem(2, 1, 9, 3, mk);
    const size_t n = static_cast<size_t>(p.B) * p.H * p.T * p.D;
    const Input q = random_input(n, 11, DType::bf16), k = random_input(n, 12, DType::bf16),
                v = random_input(n, 13, DType::bf16), g = random_input(n, 14, DType::bf16);
    const hr::ref::AttentionShape sh{p.B, p.H, p.T, p.D};
    auto loss = [&](const std::vector<double>& qq, const std::vector<double>& kk, const std::vector<double>& vv) {
      return hr::test::dot(hr::ref::attention_forward(qq, kk, vv, sh, p.causal, p.kv_len, p.seg, p.scale), g.values);
    };
    const Grads want = reference_backward(p, q.values, k.values, v.values, g.values);
    const auto fq = hr::test::finite_diff_grad([&](const std::vector<double>& x) { return loss(x, k.values, v.values); },
                                               q.values);
    const auto fk = hr::test::finite_diff_grad([&](const std::vector<double>& x) { return loss(q.values, x, v.values); },
                                               k.values);
    const auto fv = hr::test::finite_diff_grad([&](const std::vector<double>& x) { return loss(q.values, k.values, x); },
                                               v.values);
    const std::vector<float> dq(want.dq.begin(), want.dq.end()), dk(want.dk.begin(), want.dk.end()),
        dv(want.dv.begin(), want.dv.end());
    // float64 on both sides: the differences' own truncation, well under fp32's bound.
    const double bound = hr::tol::kAttentionGradNmse(DType::f32);
    EXPECT_TRUE(hr::test::nmse_within(dq, fq, bound, fmt::format("dq {}", mask_name(mk))));
    EXPECT_TRUE(hr::test::nmse_within(dk, fk, bound, fmt::format("dk {}", mask_name(mk))));
    EXPECT_TRUE(hr::test::nmse_within(dv, fv, bound, fmt::format("dv {}", mask_name(mk))));
  }
}

#if HEADROOM_HAVE_CUDA

namespace tc = hr::ops::cuda::attn_tc;
namespace emu = hr::warp_emu;
using hr::test::attn::Case;
using hr::test::attn::expect_same_bits;
using hr::test::attn::Inputs;
using hr::test::attn::inputs_for;
using hr::test::attn::kFirstSchedule;
using hr::test::attn::KernelOutputs;
using hr::test::attn::kSecondSchedule;
using hr::test::attn::run_three;

// The three kernels on emulated warps, launched as the dispatcher launches them
// (grid: one block per head and tile of 64 rows), with D_i = rowsum(dO * O) between.
template <typename S, int kD>
KernelOutputs run_kernels(const Problem& p, const Input& q, const Input& k, const Input& v, const Input& dout,
                          const emu::Schedule& schedule, const emu::Fault& fault = {}) {
  return run_three<S>(p, q, k, v, dout, tc::kTile, {tc::kThreads, tc::kThreads, tc::kThreads},
                      {tc::forward_smem_bytes<kD>(), tc::dq_smem_bytes<kD>(), tc::dkv_smem_bytes<kD>()},
                      tc::tc_forward_kernel<S, kD>, tc::tc_dq_kernel<S, kD>, tc::tc_dkv_kernel<S, kD>, schedule, fault);
}

// The kernels of the head-dim bucket that takes D, as the dispatcher picks it.
KernelOutputs run_for(DType dt, const Problem& p, const Input& q, const Input& k, const Input& v, const Input& g,
                      const emu::Schedule& schedule, const emu::Fault& fault = {}) {
  return hr::ops::cuda::attn_kernels::with_head_dim(p.D, [&](auto kd) {
    constexpr int kD = decltype(kd)::value;
    return dt == DType::f16 ? run_kernels<half_t, kD>(p, q, k, v, g, schedule, fault)
                            : run_kernels<bfloat16_t, kD>(p, q, k, v, g, schedule, fault);
  });
}

void check(DType dt, std::initializer_list<Case> cases) { hr::test::attn::check_cases(run_for, dt, cases, 100); }

// Three query tiles and key steps, the last partial, most of them wholly inside
// the allowed keys when unmasked or below the causal diagonal (T 130, D 64); the
// widest bucket (D 128).
TEST(AttentionTensorCoreEmulated, Bf16TilesAndStepsMatchFloat64UnderEveryMask) {
  check(DType::bf16, {Case{130, 64}, Case{70, 128}});
}
// Rows that are no whole 16-byte vectors (D 100: element-wise staging and stores),
// a head dim below its bucket's (40 of 64) and a few rows (T 3: a gradient of one
// row is zero only where it sees one key, and a reference of zeros has no NMSE).
TEST(AttentionTensorCoreEmulated, Bf16PaddedHeadDimsMatchFloat64UnderEveryMask) {
  check(DType::bf16, {Case{66, 100}, Case{70, 40}, Case{3, 16}});
}
// fp16: its rounding, and dS taken times a power of two (ds_prescale).
TEST(AttentionTensorCoreEmulated, Fp16MatchesFloat64UnderEveryMask) { check(DType::f16, {Case{130, 64}, Case{66, 100}}); }

// Key lengths alone and with the causal mask, one of them 0 (check_key_length_cases).
TEST(AttentionTensorCoreEmulated, KeyLengthsAloneAndZeroMatchFloat64) {
  hr::test::attn::check_key_length_cases(run_for, {DType::bf16, DType::f16}, 300);
}

// fp16 where dS passes fp16's range: near-uniform attention (small q, k) over large
// values, so that dS = P (dP - D) grows with |v| while dQ and dK stay small, and dO
// scaled by powers of two until the float64 dS reaches 1.25 x 65504 while every
// gradient stays under half of it. Rounding dS as it is would give inf; the kernels
// round it times 2^-e and stay finite.
TEST(AttentionTensorCoreEmulated, Fp16BackwardStaysFiniteWhereDsPassesFp16sRange) {
  const Problem p = make_problem(2, 1, 97, 128, Mask::causal);
  const size_t n = static_cast<size_t>(p.B) * p.H * p.T * p.D;
  const Input q = random_input(n, 71, DType::f16, 0.25f), k = random_input(n, 72, DType::f16, 0.25f),
              v = random_input(n, 73, DType::f16, 8.f);
  float spread = 1.f;
  Input g;
  Grads want;
  for (;;) {
    g = random_input(n, 74, DType::f16, spread);
    want = reference_backward(p, q.values, k.values, v.values, g.values);
    if (want.max_ds >= 1.25 * 65504 || spread >= 16384.f) break;
    spread *= 2.f;
  }
  ASSERT_GE(want.max_ds, 1.25 * 65504) << "no dO scale drives dS past fp16's range";
  double largest = 0;
  for (const auto* x : {&want.dq, &want.dk, &want.dv})
    for (double e : *x) largest = std::max(largest, std::fabs(e));
  ASSERT_LT(largest, 65504.0 / 2) << "at dO's spread " << spread << " the gradients themselves leave fp16's range";
  const KernelOutputs got = run_kernels<half_t, 128>(p, q, k, v, g, kFirstSchedule);
  expect_same_bits(got, run_kernels<half_t, 128>(p, q, k, v, g, kSecondSchedule), "fp16 past its range");
  const double bound = hr::tol::kAttentionGradNmse(DType::f16);
  EXPECT_TRUE(hr::test::nmse_within(widen(got.dq, DType::f16), want.dq, bound, fmt::format("dq, dO spread {}", spread)));
  EXPECT_TRUE(hr::test::nmse_within(widen(got.dk, DType::f16), want.dk, bound, fmt::format("dk, dO spread {}", spread)));
  EXPECT_TRUE(hr::test::nmse_within(widen(got.dv, DType::f16), want.dv, bound, fmt::format("dv, dO spread {}", spread)));
  testing::Test::RecordProperty("dout_spread", fmt::format("{}", spread));
  testing::Test::RecordProperty("max_ds", fmt::format("{:.4g}", want.max_ds));
}

// The controls of the checks above, each made by a fault of the emulated hardware
// the kernels run on: a tensor core whose sums of products are off (the float64
// checks of the output and of each gradient, grossly at 100% and subtly at a
// relative error whose NMSE lands 10-100x over each dtype's bound); block barriers
// that let threads on (the check that both schedules give the same bits: every
// barrier, grossly, and only the second of each thread, subtly); and one
// cp.async wait of each thread that does not wait (the first, before the first
// step, and the second, before the second).
TEST(AttentionTensorCoreEmulated, HardwareFaultsFailTheChecks) {
  for (const DType dt : {DType::bf16, DType::f16}) {
    const Problem p = make_problem(2, 1, 130, 64, Mask::causal);
    const Inputs x = inputs_for(p, dt, 41);
    // A relative error r in every sum gives an NMSE near r^2 on the output and about
    // three times that on the gradients: r = sqrt(20 x bound), about 20x and 60x.
    const double r = std::sqrt(20 * hr::tol::kAttentionNmse(dt));
    hr::test::attn::expect_value_faults_caught(run_for, dt, p, x,
                                               {{emu::Fault{1.0, 0}, 1.0, true, true}, {emu::Fault{r, 0}, r, true, true}});
    hr::test::attn::expect_order_faults_caught(run_for, dt, p, x,
                                               {{"every_block_barrier", emu::Fault{0, -1, 0}},
                                                {"block_barrier_2", emu::Fault{0, 2, 0}},
                                                {"copy_wait_1", emu::Fault{0, 0, 1}},
                                                {"copy_wait_2", emu::Fault{0, 0, 2}}});
  }
}

// Every ldmatrix of the three kernels takes one shared-memory wavefront per 8 x 8
// matrix: the 16-byte rows a matrix gathers fall in 8 different groups of 4 banks,
// which the tiles' row stride of kD + 8 elements gives (a stride of kD would put a
// matrix's 8 rows in one group at kD 64 and 128: 8 wavefronts). Each head-dim
// bucket, run with every thread in turn (the emulation's third schedule), which
// must also give the first schedule's bits.
TEST(AttentionTensorCoreEmulated, LdmatrixLoadsAreFreeOfBankConflicts) {
  for (const int D : {32, 64, 128}) {
    const Problem p = make_problem(1, 1, 130, D, Mask::causal);
    const size_t n = static_cast<size_t>(p.T) * p.D;
    const Input q = random_input(n, 31, DType::bf16), k = random_input(n, 32, DType::bf16),
                v = random_input(n, 33, DType::bf16), g = random_input(n, 34, DType::bf16);
    const KernelOutputs got = run_for(DType::bf16, p, q, k, v, g, emu::Schedule{});
    expect_same_bits(run_for(DType::bf16, p, q, k, v, g, kFirstSchedule), got, fmt::format("interleaved, D {}", D));
    struct Kernel {
      const char* name;
      const emu::LaunchStats& stats;
    };
    for (const Kernel& x : {Kernel{"forward", got.forward}, Kernel{"dq", got.dq_stats}, Kernel{"dkv", got.dkv_stats}}) {
      ASSERT_GT(x.stats.ldmatrix, 0u) << x.name << " D " << D << " ran no ldmatrix";
      EXPECT_EQ(x.stats.ldmatrix_wavefronts, 4 * x.stats.ldmatrix)
          << x.name << " D " << D << ": " << x.stats.ldmatrix << " ldmatrix .x4 took " << x.stats.ldmatrix_wavefronts
          << " wavefronts, 4 each without bank conflicts";
      testing::Test::RecordProperty(fmt::format("{}_d{}_wavefronts_per_ldmatrix", x.name, D),
                                    fmt::format("{:.3g}", static_cast<double>(x.stats.ldmatrix_wavefronts) /
                                                              static_cast<double>(x.stats.ldmatrix)));
    }
  }
}

// Every cp.async write of the three kernels takes one shared-memory wavefront per
// phase (8 lanes of 16-byte copies, a warp of 4-byte ones): a phase's 16-byte
// chunks fall in 8 different groups of 4 banks. At head dim 32 a tile row is 64
// bytes of data 80 apart, so 8 lanes over 2 rows of 4 chunks would put two chunks
// in one group (2 wavefronts): there a phase takes one chunk of 8 rows. Whole tiles
// (T 128), so that every lane of a warp issues each copy.
TEST(AttentionTensorCoreEmulated, CpAsyncWritesAreFreeOfBankConflicts) {
  for (const int D : {32, 64, 128}) {
    const Problem p = make_problem(1, 1, 128, D, Mask::causal);
    const Inputs x = inputs_for(p, DType::bf16, 51);
    const KernelOutputs got = run_for(DType::bf16, p, x.q, x.k, x.v, x.g, kFirstSchedule);
    struct Kernel {
      const char* name;
      const emu::LaunchStats& stats;
    };
    for (const Kernel& k : {Kernel{"forward", got.forward}, Kernel{"dq", got.dq_stats}, Kernel{"dkv", got.dkv_stats}}) {
      ASSERT_GT(k.stats.cp_async_phases, 0u) << k.name << " D " << D << " issued no cp.async";
      EXPECT_EQ(k.stats.cp_async_wavefronts, k.stats.cp_async_phases)
          << k.name << " D " << D << ": cp.async writes took " << k.stats.cp_async_wavefronts << " wavefronts in "
          << k.stats.cp_async_phases << " phases, one each without bank conflicts";
      testing::Test::RecordProperty(fmt::format("{}_d{}_wavefronts_per_cp_async_phase", k.name, D),
                                    fmt::format("{:.3g}", static_cast<double>(k.stats.cp_async_wavefronts) /
                                                              static_cast<double>(k.stats.cp_async_phases)));
    }
  }
}

// The cp.async wavefront count itself, on one warp's 16-byte copies to rows a
// stride apart, 4 chunks a row and 2 rows a phase: rows 64 bytes apart fill a
// phase's 8 groups of banks (1 wavefront), rows 80 apart share one group (2), rows
// 128 apart all four (2: each group twice); and 4-byte copies of a warp to 32
// consecutive words (1) or to one bank 128 bytes apart (32).
TEST(AttentionTensorCoreEmulated, CpAsyncWavefrontsAreCountedFromTheAddresses) {
  alignas(16) static uint16_t global[4096] = {};
  struct Layout {
    int stride, bytes;  // destination stride between rows (16-byte copies) or lanes (4-byte)
    uint64_t per_phase;
  };
  for (const Layout l : {Layout{64, 16, 1}, Layout{80, 16, 2}, Layout{128, 16, 2}, Layout{4, 4, 1}, Layout{128, 4, 32}}) {
    const emu::LaunchStats st = emu::launch(dim3(1), 32, 32 * 128, [&] {
      const int L = static_cast<int>(threadIdx.x);
      const int at = l.bytes == 16 ? (L / 4) * l.stride + (L % 4) * 16 : L * l.stride;
      __pipeline_memcpy_async(emu::shared_memory() + at, global + 8 * L, static_cast<size_t>(l.bytes));
      __pipeline_commit();
      __pipeline_wait_prior(0);
    });
    const uint64_t phases = l.bytes == 16 ? 4 : 1;
    EXPECT_EQ(st.cp_async_phases, phases) << l.bytes << "-byte copies " << l.stride << " bytes apart";
    EXPECT_EQ(st.cp_async_wavefronts, phases * l.per_phase) << l.bytes << "-byte copies " << l.stride << " bytes apart";
  }
}

// The wavefront count itself, on one warp's ldmatrix over rows a stride apart:
// 16-byte rows 144 bytes apart fall in 8 groups of banks (1 wavefront a matrix),
// 128 bytes apart all in one (8), 64 apart in two (4), and one row given by all 8
// lanes of a matrix is read once (1).
TEST(AttentionTensorCoreEmulated, LdmatrixWavefrontsAreCountedFromTheRowAddresses) {
  struct Layout {
    int stride;  // bytes between the rows of lanes 0-31; 0: one row for all
    uint64_t per_matrix;
  };
  for (const Layout l : {Layout{144, 1}, Layout{128, 8}, Layout{64, 4}, Layout{0, 1}}) {
    const emu::LaunchStats st = emu::launch(dim3(1), 32, 32 * 144, [&] {
      uint32_t r[4];
      emu::ldmatrix_x4(r, emu::shared_memory() + static_cast<int>(threadIdx.x) * l.stride, false);
    });
    EXPECT_EQ(st.ldmatrix, 1u);
    EXPECT_EQ(st.ldmatrix_wavefronts, 4 * l.per_matrix) << "rows " << l.stride << " bytes apart";
  }
}

// What the hardware refuses stops the emulated kernel too, saying what and where:
// an ldmatrix row past shared memory, a cp.async off its alignment, copies never
// waited for, and a barrier that some threads never reach.
TEST(AttentionTensorCoreEmulatedDeathTest, WhatTheHardwareRefusesStopsTheKernel) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  static uint16_t global[64] alignas(16) = {};
  EXPECT_DEATH(emu::launch(dim3(1), 32, 256,
                           [] {
                             uint32_t r[4];
                             emu::ldmatrix_x4(r, emu::shared_memory() + 256 - 16 + 16 * (threadIdx.x == 5), false);
                           }),
               "ldmatrix row address: 16 bytes at \\+256 from shared memory's 256, thread 5");
  EXPECT_DEATH(emu::launch(dim3(1), 32, 256,
                           [] { __pipeline_memcpy_async(emu::shared_memory() + 8, global, 16); }),
               "cp.async destination: shared offset 8 is not 16-byte aligned");
  EXPECT_DEATH(emu::launch(dim3(1), 32, 256,
                           [] {
                             __pipeline_memcpy_async(emu::shared_memory() + 16 * threadIdx.x % 256, global, 16);
                             __pipeline_commit();
                           }),
               "ends with 1 cp.async copies it never waited for");
  EXPECT_DEATH(emu::launch(dim3(1), 64, 0,
                           [] {
                             if (threadIdx.x < 32) __syncthreads();
                           }),
               "every live thread waits at a barrier that the others never reach");
}

#else

TEST(AttentionTensorCoreEmulated, KernelsRunOnEmulatedWarps) {
  GTEST_SKIP() << "built without the CUDA toolkit: the kernels' headers are not here";
}

#endif

}  // namespace
