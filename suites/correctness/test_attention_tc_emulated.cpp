// The tensor-core attention kernels' own code (kernels/attention/attention_tc_kernels.cuh)
// run on emulated warps (suites/common/warp_emulation.hpp), so that their indexing,
// fragments, masks, pipelines and arithmetic are checked on every machine, not only
// where a GPU runs the conformance cases (Cuda/AttentionTensorCore.*). The forward
// is held to the float64 reference of OPS-1, the backward to a float64 gradient
// computed here from the definition (P, dV = P^T dO, dS = P (dP - rowsum(P dP)),
// dQ = scale dS K, dK = scale dS^T Q) with its own mask predicate; that gradient is
// itself held to finite differences of the reference on a small shape. Shapes cross
// the tiles' edges and take the steps wholly inside the allowed keys (which skip the
// per-element mask test) and the others, under every mask, at each head-dim bucket;
// each runs under two schedules that must give the same bits (a missing barrier or
// cp.async wait shows), and the ldmatrix loads are held free of bank conflicts. The
// checks' controls are faults of the emulated hardware (emu::Fault).
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <string>
#include <type_traits>
#include <vector>

#include "harness/tolerances.hpp"
#include "kernels/attention/attention_ref.hpp"
#include "kernels/common/float16.hpp"
#include "suites/common/attention_masks.hpp"
#include "suites/common/finite_diff.hpp"
#include "suites/common/op_check.hpp"
#include "suites/common/test_support.hpp"

#if HEADROOM_HAVE_CUDA
// Last: it defines the CUDA names (threadIdx, __syncthreads, ...) on emulated threads.
#include "suites/common/warp_emulation.hpp"
#include "kernels/attention/attention_tc_kernels.cuh"
#endif

namespace {

using hr::bfloat16_t;
using hr::DType;
using hr::half_t;

using hr::test::kAllMasks;
using hr::test::mask_name;
using Mask = hr::test::MaskKind;

struct Problem {
  int B, H, T, D;
  float scale;
  bool causal = false;
  std::vector<int32_t> kv_len;  // [B] or empty
  std::vector<int32_t> seg;     // [B, T] or empty
};

Problem make_problem(int B, int H, int T, int D, Mask mk) {
  Problem p{B, H, T, D, 1.f / std::sqrt(static_cast<float>(D))};
  p.causal = hr::test::is_causal(mk);
  if (hr::test::has_key_lengths(mk))
    for (int b = 0; b < B; ++b) p.kv_len.push_back(b % 2 == 0 ? T - 1 : T / 2 + 3);  // one key short, about half
  if (hr::test::has_segments(mk)) {
    const int lens[] = {37, 5, 70, 1, 19};  // documents across the 64-row tiles
    for (int b = 0; b < B; ++b) {
      int id = 0, used = 0, li = b;
      for (int t = 0; t < T; ++t) {
        if (used == lens[li % 5]) ++id, ++li, used = 0;
        p.seg.push_back(id);
        ++used;
      }
    }
  }
  return p;
}

// Whether query t of batch row b sees key s: the masks' definitions, written here
// apart from the kernels' predicate.
bool visible(const Problem& p, int b, int t, int s) {
  if (p.causal && s > t) return false;
  if (!p.kv_len.empty() && s >= p.kv_len[static_cast<size_t>(b)]) return false;
  if (!p.seg.empty() && p.seg[static_cast<size_t>(b * p.T + s)] != p.seg[static_cast<size_t>(b * p.T + t)])
    return false;
  return true;
}

struct Grads {
  std::vector<double> dq, dk, dv;
  double max_ds = 0;  // the largest |P (dP - rowsum(P dP))|, before the scale
};

// The float64 gradient of sum(out * dout) from the definition, per head.
Grads reference_backward(const Problem& p, const std::vector<double>& q, const std::vector<double>& k,
                         const std::vector<double>& v, const std::vector<double>& dout) {
  const int T = p.T, D = p.D;
  Grads g{std::vector<double>(q.size()), std::vector<double>(q.size()), std::vector<double>(q.size())};
  std::vector<double> P(static_cast<size_t>(T) * T), dP(static_cast<size_t>(T) * T);
  for (int bh = 0; bh < p.B * p.H; ++bh) {
    const int b = bh / p.H;
    const size_t o = static_cast<size_t>(bh) * T * D;
    auto at = [&](const std::vector<double>& x, int row, int d) { return x[o + static_cast<size_t>(row) * D + d]; };
    for (int t = 0; t < T; ++t) {
      double mx = -INFINITY;
      for (int s = 0; s < T; ++s) {
        double sc = -INFINITY;
        if (visible(p, b, t, s)) {
          sc = 0;
          for (int d = 0; d < D; ++d) sc += at(q, t, d) * at(k, s, d);
          sc *= p.scale;
        }
        P[static_cast<size_t>(t) * T + s] = sc;
        mx = std::max(mx, sc);
      }
      double sum = 0;
      for (int s = 0; s < T; ++s) {
        double& x = P[static_cast<size_t>(t) * T + s];
        x = x == -INFINITY ? 0.0 : std::exp(x - mx);
        sum += x;
      }
      for (int s = 0; s < T; ++s) P[static_cast<size_t>(t) * T + s] = sum > 0 ? P[static_cast<size_t>(t) * T + s] / sum : 0.0;
      double row = 0;
      for (int s = 0; s < T; ++s) {
        double x = 0;
        for (int d = 0; d < D; ++d) x += at(dout, t, d) * at(v, s, d);
        dP[static_cast<size_t>(t) * T + s] = x;
        row += x * P[static_cast<size_t>(t) * T + s];
      }
      for (int s = 0; s < T; ++s) {
        const double pts = P[static_cast<size_t>(t) * T + s];
        const double ds = pts * (dP[static_cast<size_t>(t) * T + s] - row);
        g.max_ds = std::max(g.max_ds, std::fabs(ds));
        for (int d = 0; d < D; ++d) {
          g.dq[o + static_cast<size_t>(t) * D + d] += p.scale * ds * at(k, s, d);
          g.dk[o + static_cast<size_t>(s) * D + d] += p.scale * ds * at(q, t, d);
          g.dv[o + static_cast<size_t>(s) * D + d] += pts * at(dout, t, d);
        }
      }
    }
  }
  return g;
}

// Values drawn in [-1, 1), none zero, as stored in 16 bits, and widened.
struct Input {
  std::vector<uint16_t> bits;
  std::vector<double> values;
};
Input random_input(size_t n, uint64_t seed, DType dt, float spread = 1.f) {
  Input x;
  for (float f : hr::test::random_nonzero(n, seed, -spread, spread)) {
    const uint16_t b = dt == DType::f16 ? hr::float_to_half_bits(f) : hr::float_to_bf16_bits(f);
    x.bits.push_back(b);
    x.values.push_back(dt == DType::f16 ? hr::half_bits_to_float(b) : hr::bf16_bits_to_float(b));
  }
  return x;
}
std::vector<float> widen(const std::vector<uint16_t>& bits, DType dt) {
  std::vector<float> out;
  for (uint16_t b : bits) out.push_back(dt == DType::f16 ? hr::half_bits_to_float(b) : hr::bf16_bits_to_float(b));
  return out;
}

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

struct KernelOutputs {
  std::vector<uint16_t> out, dq, dk, dv;
  std::vector<float> lse;
  emu::LaunchStats forward, dq_stats, dkv_stats;  // each kernel's
};

// The two schedules every case runs under. Both are orders a GPU may run a block
// in, so a kernel gives the same bits under each, and a missing barrier or wait
// shows as a difference: the first runs the warps one at a time from the first to
// the last between two block barriers and lands a cp.async copy only at its
// thread's wait (a tile read before its wait or barrier is stale); the second runs
// them from the last to the first and lands copies as they are issued (a prefetch
// into a tile other warps still read shows). Every pair of warps runs in one order
// under the first and in the other under the second, in every phase.
const emu::Schedule kFirstSchedule{emu::Schedule::Warps::one_at_a_time, emu::Schedule::Copies::at_wait};
const emu::Schedule kSecondSchedule{emu::Schedule::Warps::one_at_a_time_reversed, emu::Schedule::Copies::at_issue};

// The three kernels on emulated warps, launched as the dispatcher launches them
// (grid: one block per head and tile of 64 rows), with D_i = rowsum(dO * O) between.
template <typename S, int kD>
KernelOutputs run_kernels(const Problem& p, const Input& q, const Input& k, const Input& v, const Input& dout,
                          const emu::Schedule& schedule, const emu::Fault& fault = {}) {
  const size_t n = q.bits.size(), rows = static_cast<size_t>(p.B) * p.H * p.T;
  KernelOutputs r{std::vector<uint16_t>(n), std::vector<uint16_t>(n), std::vector<uint16_t>(n),
                  std::vector<uint16_t>(n), std::vector<float>(rows), {}, {}, {}};
  const tc::MaskArgs m{p.causal, p.kv_len.empty() ? nullptr : p.kv_len.data(), p.seg.empty() ? nullptr : p.seg.data()};
  auto in = [](const Input& x) { return reinterpret_cast<const S*>(x.bits.data()); };
  auto out = [](std::vector<uint16_t>& x) { return reinterpret_cast<S*>(x.data()); };
  const dim3 grid(static_cast<unsigned>(p.B * p.H), static_cast<unsigned>((p.T + tc::kTile - 1) / tc::kTile));
  r.forward = emu::launch(
      grid, tc::kThreads, tc::forward_smem_bytes<kD>(),
      [&] { tc::tc_forward_kernel<S, kD>(in(q), in(k), in(v), m, p.H, p.T, p.D, p.scale, out(r.out), r.lse.data()); },
      schedule, fault);
  std::vector<float> row_dot(rows);
  for (size_t i = 0; i < rows; ++i) {
    float s = 0.f;
    for (int d = 0; d < p.D; ++d) {
      const size_t e = i * static_cast<size_t>(p.D) + static_cast<size_t>(d);
      s += hr::to_float(reinterpret_cast<const S*>(dout.bits.data())[e]) * hr::to_float(out(r.out)[e]);
    }
    row_dot[i] = s;
  }
  r.dq_stats = emu::launch(
      grid, tc::kThreads, tc::dq_smem_bytes<kD>(),
      [&] {
        tc::tc_dq_kernel<S, kD>(in(q), in(k), in(v), in(dout), r.lse.data(), row_dot.data(), m, p.H, p.T, p.D,
                                p.scale, out(r.dq));
      },
      schedule, fault);
  r.dkv_stats = emu::launch(
      grid, tc::kThreads, tc::dkv_smem_bytes<kD>(),
      [&] {
        tc::tc_dkv_kernel<S, kD>(in(q), in(k), in(v), in(dout), r.lse.data(), row_dot.data(), m, p.H, p.T, p.D,
                                 p.scale, out(r.dk), out(r.dv));
      },
      schedule, fault);
  return r;
}

// The kernels of the head-dim bucket that takes D, as the dispatcher picks it.
KernelOutputs run_for(DType dt, const Problem& p, const Input& q, const Input& k, const Input& v, const Input& g,
                      const emu::Schedule& schedule, const emu::Fault& fault = {}) {
  auto at = [&](auto kd) {
    constexpr int kD = decltype(kd)::value;
    return dt == DType::f16 ? run_kernels<half_t, kD>(p, q, k, v, g, schedule, fault)
                            : run_kernels<bfloat16_t, kD>(p, q, k, v, g, schedule, fault);
  };
  if (p.D <= 32) return at(std::integral_constant<int, 32>{});
  if (p.D <= 64) return at(std::integral_constant<int, 64>{});
  return at(std::integral_constant<int, 128>{});
}

// How many elements of each output differ in their bits between two runs.
struct BitDiffs {
  size_t out, lse, dq, dk, dv;
  size_t total() const { return out + lse + dq + dk + dv; }
};
BitDiffs bit_diffs(const KernelOutputs& first, const KernelOutputs& second) {
  auto differ = [](const auto& a, const auto& b) {
    size_t n = 0;
    for (size_t i = 0; i < a.size(); ++i) n += std::memcmp(&a[i], &b[i], sizeof a[i]) != 0;
    return n;
  };
  return {differ(first.out, second.out), differ(first.lse, second.lse), differ(first.dq, second.dq),
          differ(first.dk, second.dk), differ(first.dv, second.dv)};
}

// The same bits under the second schedule as under the first (kFirstSchedule).
void expect_same_bits(const KernelOutputs& first, const KernelOutputs& second, const std::string& what) {
  const BitDiffs d = bit_diffs(first, second);
  EXPECT_EQ(d.out, 0u) << "outputs differ between the schedules, " << what;
  EXPECT_EQ(d.lse, 0u) << "log-sum-exps differ between the schedules, " << what;
  EXPECT_EQ(d.dq, 0u) << "dQ differs between the schedules, " << what;
  EXPECT_EQ(d.dk, 0u) << "dK differs between the schedules, " << what;
  EXPECT_EQ(d.dv, 0u) << "dV differs between the schedules, " << what;
}

struct Case {
  int T, D;
};

// Forward and backward of one dtype over `cases`, under every mask.
void check(DType dt, std::initializer_list<Case> cases) {
  uint64_t seed = 100;
  double worst_fwd = 0, worst_bwd = 0;
  for (const Case c : cases)
    for (Mask mk : kAllMasks) {
      const Problem p = make_problem(2, 1, c.T, c.D, mk);
      const size_t n = static_cast<size_t>(p.B) * p.H * p.T * p.D;
      const Input q = random_input(n, seed += 4, dt), k = random_input(n, seed + 1, dt),
                  v = random_input(n, seed + 2, dt), g = random_input(n, seed + 3, dt);
      const KernelOutputs got = run_for(dt, p, q, k, v, g, kFirstSchedule);
      const std::string what = fmt::format("{} T {} D {} mask {}", hr::dtype_name(dt), c.T, c.D, mask_name(mk));
      expect_same_bits(got, run_for(dt, p, q, k, v, g, kSecondSchedule), what);
      const auto want_out = hr::ref::attention_forward(q.values, k.values, v.values, {p.B, p.H, p.T, p.D}, p.causal,
                                                       p.kv_len, p.seg, p.scale);
      const std::vector<float> out = widen(got.out, dt);
      EXPECT_TRUE(hr::test::nmse_within(out, want_out, hr::tol::kAttentionNmse(dt), "out " + what));
      worst_fwd = std::max(worst_fwd, hr::test::nmse(out, want_out));
      const Grads want = reference_backward(p, q.values, k.values, v.values, g.values);
      const double bound = hr::tol::kAttentionGradNmse(dt);
      struct Gradient {
        const char* name;
        const std::vector<uint16_t>& got;
        const std::vector<double>& want;
      };
      for (const Gradient& x : {Gradient{"dq", got.dq, want.dq}, Gradient{"dk", got.dk, want.dk},
                                Gradient{"dv", got.dv, want.dv}}) {
        const std::vector<float> values = widen(x.got, dt);
        EXPECT_TRUE(hr::test::nmse_within(values, x.want, bound, fmt::format("{} {}", x.name, what)));
        worst_bwd = std::max(worst_bwd, hr::test::nmse(values, x.want));
      }
    }
  testing::Test::RecordProperty("worst_nmse", fmt::format("{:.3g}", worst_fwd));
  testing::Test::RecordProperty("worst_grad_nmse", fmt::format("{:.3g}", worst_bwd));
}

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
    const size_t n = static_cast<size_t>(p.B) * p.H * p.T * p.D;
    const Input q = random_input(n, 41, dt), k = random_input(n, 42, dt), v = random_input(n, 43, dt),
                g = random_input(n, 44, dt);
    const auto want_out =
        hr::ref::attention_forward(q.values, k.values, v.values, {p.B, p.H, p.T, p.D}, p.causal, p.kv_len, p.seg, p.scale);
    const Grads want = reference_backward(p, q.values, k.values, v.values, g.values);
    const double fwd_bound = hr::tol::kAttentionNmse(dt), bwd_bound = hr::tol::kAttentionGradNmse(dt);
    // A relative error r in every sum gives an NMSE near r^2 on the output and about
    // three times that on the gradients: r = sqrt(20 x bound), about 20x and 60x.
    for (const double r : {1.0, std::sqrt(20 * fwd_bound)}) {
      const KernelOutputs got = run_for(dt, p, q, k, v, g, kFirstSchedule, emu::Fault{r, 0});
      struct Output {
        const char* name;
        std::vector<float> got;
        const std::vector<double>& want;
        double bound;
      };
      const std::vector<double> want_out64(want_out.begin(), want_out.end());
      for (const Output& o : {Output{"out", widen(got.out, dt), want_out64, fwd_bound},
                              Output{"dq", widen(got.dq, dt), want.dq, bwd_bound},
                              Output{"dk", widen(got.dk, dt), want.dk, bwd_bound},
                              Output{"dv", widen(got.dv, dt), want.dv, bwd_bound}}) {
        const double ratio = hr::test::nmse(o.got, o.want) / o.bound;
        EXPECT_FALSE(hr::test::nmse_within(o.got, o.want, o.bound, o.name))
            << hr::dtype_name(dt) << " " << o.name << " passed with the products " << r << " off";
        if (r < 1)  // the subtle control is near the bound, not far past it
          EXPECT_LT(ratio, 100) << hr::dtype_name(dt) << " " << o.name << ": NMSE " << ratio << "x the bound";
        testing::Test::RecordProperty(fmt::format("{}_{}_nmse_over_bound_at_r_{:.3g}", hr::dtype_name(dt), o.name, r),
                                      fmt::format("{:.3g}", ratio));
      }
    }
    const KernelOutputs first = run_for(dt, p, q, k, v, g, kFirstSchedule);
    struct Skip {
      const char* what;
      emu::Fault fault;
    };
    for (const Skip& x : {Skip{"every_block_barrier", emu::Fault{0, -1, 0}}, Skip{"block_barrier_2", emu::Fault{0, 2, 0}},
                          Skip{"copy_wait_1", emu::Fault{0, 0, 1}}, Skip{"copy_wait_2", emu::Fault{0, 0, 2}}}) {
      const BitDiffs d = bit_diffs(run_for(dt, p, q, k, v, g, kFirstSchedule, x.fault),
                                   run_for(dt, p, q, k, v, g, kSecondSchedule, x.fault));
      EXPECT_GT(d.total(), 0u) << hr::dtype_name(dt) << ": both schedules gave the same bits with " << x.what
                               << " skipped";
      testing::Test::RecordProperty(fmt::format("{}_elements_differing_skip_{}", hr::dtype_name(dt), x.what),
                                    fmt::format("{}", d.total()));
    }
    expect_same_bits(first, run_for(dt, p, q, k, v, g, kSecondSchedule), "no fault");
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
