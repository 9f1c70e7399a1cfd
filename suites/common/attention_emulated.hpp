// What the emulated attention kernel tests (tensor-core and scalar) share: one
// forward and backward on emulated warps (suites/common/warp_emulation.hpp), the
// two schedules each case runs under and the elements whose bits differ between
// them, the check of a problem against float64, the cases every kernel family runs,
// and the loops of their controls. Include it last but for the kernels' header: it
// brings in the warp emulation, which defines the CUDA names (threadIdx,
// __syncthreads, ...).
#pragma once

#include <gtest/gtest.h>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <string>
#include <vector>

#include "harness/tolerances.hpp"
#include "kernels/attention/attention_launch.hpp"
#include "kernels/attention/attention_ref.hpp"
#include "kernels/common/float16.hpp"
#include "suites/common/attention_problem.hpp"
#include "suites/common/op_check.hpp"
#include "suites/common/warp_emulation.hpp"

namespace hr::test::attn {

namespace emu = hr::warp_emu;

struct KernelOutputs {
  size_t width = 2;                            // bytes an element
  std::vector<unsigned char> out, dq, dk, dv;  // as stored in the dtype
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

// One forward and backward of p as the dispatcher runs them, on emulated warps:
// the forward kernel over one block per head and tile of `tile` rows, then
// D_i = rowsum(dO * O) on the host, then the dQ kernel and the dK, dV kernel; kernel
// i with threads[i] a block and smem[i] bytes of dynamic shared memory. The kernels
// take the arguments the attention kernels take.
template <typename S, typename Forward, typename Dq, typename Dkv>
KernelOutputs run_three(const Problem& p, const Input& q, const Input& k, const Input& v, const Input& dout, int tile,
                        const int (&threads)[3], const size_t (&smem)[3], Forward forward, Dq dq, Dkv dkv,
                        const emu::Schedule& schedule, const emu::Fault& fault) {
  const hr::ops::cuda::attn_kernels::MaskArgs mask{p.causal, p.kv_len.empty() ? nullptr : p.kv_len.data(),
                                                   p.seg.empty() ? nullptr : p.seg.data()};
  const dim3 grid(static_cast<unsigned>(p.B * p.H), static_cast<unsigned>((p.T + tile - 1) / tile));
  const size_t n = dout.values.size(), rows = static_cast<size_t>(p.B) * p.H * p.T;
  KernelOutputs r;
  r.width = sizeof(S);
  for (auto* x : {&r.out, &r.dq, &r.dk, &r.dv}) x->assign(n * sizeof(S), 0);
  r.lse.assign(rows, 0.f);
  auto at = [](std::vector<unsigned char>& x) { return reinterpret_cast<S*>(x.data()); };
  const S *qs = q.as<S>(), *ks = k.as<S>(), *vs = v.as<S>(), *gs = dout.as<S>();
  S *out = at(r.out), *dqs = at(r.dq), *dks = at(r.dk), *dvs = at(r.dv);
  float* lse = r.lse.data();
  r.forward = emu::launch(
      grid, threads[0], smem[0], [&] { forward(qs, ks, vs, mask, p.H, p.T, p.D, p.scale, out, lse); }, schedule, fault);
  std::vector<float> row_dot(rows);
  for (size_t i = 0; i < rows; ++i) {
    float s = 0.f;
    for (size_t e = i * static_cast<size_t>(p.D); e < (i + 1) * static_cast<size_t>(p.D); ++e)
      s += hr::to_float(gs[e]) * hr::to_float(out[e]);
    row_dot[i] = s;
  }
  const float* dot = row_dot.data();
  r.dq_stats = emu::launch(
      grid, threads[1], smem[1], [&] { dq(qs, ks, vs, gs, lse, dot, mask, p.H, p.T, p.D, p.scale, dqs); }, schedule,
      fault);
  r.dkv_stats = emu::launch(
      grid, threads[2], smem[2], [&] { dkv(qs, ks, vs, gs, lse, dot, mask, p.H, p.T, p.D, p.scale, dks, dvs); },
      schedule, fault);
  return r;
}

// A test's kernels of a dtype and of the head-dim bucket that takes p.D on emulated
// warps, as the dispatcher picks them: run(dt, p, q, k, v, dout, schedule, fault).
using RunFor = std::function<KernelOutputs(DType, const Problem&, const Input&, const Input&, const Input&,
                                           const Input&, const emu::Schedule&, const emu::Fault&)>;

struct Inputs {
  Input q, k, v, g;  // g: the incoming gradient dO
};
inline Inputs inputs_for(const Problem& p, DType dt, uint64_t seed) {
  const size_t n = static_cast<size_t>(p.B) * p.H * p.T * p.D;
  return {random_input(n, seed, dt), random_input(n, seed + 1, dt), random_input(n, seed + 2, dt),
          random_input(n, seed + 3, dt)};
}

// How many elements of each output differ in their bits between two runs.
struct BitDiffs {
  size_t out, lse, dq, dk, dv;
  size_t total() const { return out + lse + dq + dk + dv; }
};
inline BitDiffs bit_diffs(const KernelOutputs& first, const KernelOutputs& second) {
  auto differ = [](const void* a, const void* b, size_t n, size_t width) {
    size_t d = 0;
    for (size_t i = 0; i < n; ++i)
      d += std::memcmp(static_cast<const char*>(a) + i * width, static_cast<const char*>(b) + i * width, width) != 0;
    return d;
  };
  auto elements = [&](const std::vector<unsigned char>& a, const std::vector<unsigned char>& b) {
    EXPECT_EQ(a.size(), b.size());
    return differ(a.data(), b.data(), std::min(a.size(), b.size()) / first.width, first.width);
  };
  EXPECT_EQ(first.width, second.width);
  EXPECT_EQ(first.lse.size(), second.lse.size());
  return {elements(first.out, second.out),
          differ(first.lse.data(), second.lse.data(), std::min(first.lse.size(), second.lse.size()), sizeof(float)),
          elements(first.dq, second.dq), elements(first.dk, second.dk), elements(first.dv, second.dv)};
}

// The same bits under the second schedule as under the first (kFirstSchedule).
inline void expect_same_bits(const KernelOutputs& first, const KernelOutputs& second, const std::string& what) {
  const BitDiffs d = bit_diffs(first, second);
  EXPECT_EQ(d.out, 0u) << "outputs differ between the schedules, " << what;
  EXPECT_EQ(d.lse, 0u) << "log-sum-exps differ between the schedules, " << what;
  EXPECT_EQ(d.dq, 0u) << "dQ differs between the schedules, " << what;
  EXPECT_EQ(d.dk, 0u) << "dK differs between the schedules, " << what;
  EXPECT_EQ(d.dv, 0u) << "dV differs between the schedules, " << what;
}

// Worst NMSEs over the problems a test checked, recorded as its properties.
struct Worst {
  double fwd = 0, bwd = 0;
  void record() const {
    testing::Test::RecordProperty("worst_nmse", fmt::format("{:.3g}", fwd));
    testing::Test::RecordProperty("worst_grad_nmse", fmt::format("{:.3g}", bwd));
  }
};

// Forward and backward of problem p in dtype dt, on inputs drawn from `seed`: both
// schedules to the same bits, the output held to OPS-1's float64 reference and each
// gradient to the definition's.
inline void check_problem(const RunFor& run, DType dt, const Problem& p, uint64_t seed, const std::string& what,
                          Worst& worst) {
  const Inputs x = inputs_for(p, dt, seed);
  const KernelOutputs got = run(dt, p, x.q, x.k, x.v, x.g, kFirstSchedule, {});
  expect_same_bits(got, run(dt, p, x.q, x.k, x.v, x.g, kSecondSchedule, {}), what);
  const auto want_out = hr::ref::attention_forward(x.q.values, x.k.values, x.v.values, {p.B, p.H, p.T, p.D},
                                                   p.causal, p.kv_len, p.seg, p.scale);
  const std::vector<float> out = widen(got.out, dt);
  EXPECT_TRUE(hr::test::nmse_within(out, want_out, hr::tol::kAttentionNmse(dt), "out " + what));
  worst.fwd = std::max(worst.fwd, hr::test::nmse(out, want_out));
  const Grads want = reference_backward(p, x.q.values, x.k.values, x.v.values, x.g.values);
  const double bound = hr::tol::kAttentionGradNmse(dt);
  struct Gradient {
    const char* name;
    const std::vector<unsigned char>& got;
    const std::vector<double>& want;
  };
  for (const Gradient& gr :
       {Gradient{"dq", got.dq, want.dq}, Gradient{"dk", got.dk, want.dk}, Gradient{"dv", got.dv, want.dv}}) {
    const std::vector<float> values = widen(gr.got, dt);
    EXPECT_TRUE(hr::test::nmse_within(values, gr.want, bound, fmt::format("{} {}", gr.name, what)));
    worst.bwd = std::max(worst.bwd, hr::test::nmse(values, gr.want));
  }
}

struct Case {
  int T, D;
};

// Forward and backward of one dtype over `cases`, each under every mask
// (check_problem).
inline void check_cases(const RunFor& run, DType dt, std::initializer_list<Case> cases, uint64_t seed) {
  Worst worst;
  for (const Case c : cases)
    for (Mask mk : kAllMasks)
      check_problem(run, dt, make_problem(2, 1, c.T, c.D, mk), seed += 4,
                    fmt::format("{} T {} D {} mask {}", hr::dtype_name(dt), c.T, c.D, mask_name(mk)), worst);
  worst.record();
}

// Key lengths alone (no causal mask, no documents; kAllMasks has them only with
// one or the other) and with the causal mask, at each head-dim bucket, one batch
// row's length 0: its blocks see no key at all, so its output and every gradient
// of it are zeros; the others end one key into the scalar
// kernels' second and third chunks of 32 keys (33, 65) and the tensor-core kernels'
// second step of 64 (65), so that a loop that stops a key early misses a whole
// chunk or step (check_problem for each).
inline void check_key_length_cases(const RunFor& run, std::initializer_list<DType> dts, uint64_t seed) {
  Worst worst;
  for (const DType dt : dts)
    for (const int D : {32, 64, 128})
      for (const bool causal : {false, true}) {
        Problem p{3, 1, 70, D, 1.f / std::sqrt(static_cast<float>(D))};
        p.causal = causal;
        p.kv_len = {0, 33, 65};
        check_problem(run, dt, p, seed += 4,
                      fmt::format("{} T 70 D {} key lengths 0, 33, 65{}", hr::dtype_name(dt), D,
                                  causal ? ", causal" : ""),
                      worst);
      }
  worst.record();
}

// A fault of the emulated hardware that puts values off by a relative r (or, named
// by `what`, one that breaks the kernels' arithmetic, r = 1), and the float64 checks
// it is the control of: the output's, the gradients', or both.
struct ValueFault {
  emu::Fault fault;
  double r;
  bool forward, backward;
  const char* what = nullptr;
};

// Each value fault fails the float64 checks it is the control of; one with r < 1
// (the subtle control) lands under 100x their bounds. Each ratio to its bound is
// recorded as <dtype>_<output>_nmse_over_bound_at_r_<r>, or _with_<what>.
inline void expect_value_faults_caught(const RunFor& run, DType dt, const Problem& p, const Inputs& x,
                                       std::initializer_list<ValueFault> faults) {
  const auto want_out = hr::ref::attention_forward(x.q.values, x.k.values, x.v.values, {p.B, p.H, p.T, p.D},
                                                   p.causal, p.kv_len, p.seg, p.scale);
  const std::vector<double> want_out64(want_out.begin(), want_out.end());
  const Grads want = reference_backward(p, x.q.values, x.k.values, x.v.values, x.g.values);
  const double fwd_bound = hr::tol::kAttentionNmse(dt), bwd_bound = hr::tol::kAttentionGradNmse(dt);
  for (const ValueFault& f : faults) {
    const KernelOutputs got = run(dt, p, x.q, x.k, x.v, x.g, kFirstSchedule, f.fault);
    struct Output {
      const char* name;
      bool checked;
      std::vector<float> got;
      const std::vector<double>& want;
      double bound;
    };
    for (const Output& o : {Output{"out", f.forward, widen(got.out, dt), want_out64, fwd_bound},
                            Output{"dq", f.backward, widen(got.dq, dt), want.dq, bwd_bound},
                            Output{"dk", f.backward, widen(got.dk, dt), want.dk, bwd_bound},
                            Output{"dv", f.backward, widen(got.dv, dt), want.dv, bwd_bound}}) {
      if (!o.checked) continue;
      const double ratio = hr::test::nmse(o.got, o.want) / o.bound;
      const std::string fault = f.what ? fmt::format("with_{}", f.what) : fmt::format("at_r_{:.3g}", f.r);
      EXPECT_FALSE(hr::test::nmse_within(o.got, o.want, o.bound, o.name))
          << hr::dtype_name(dt) << " " << o.name << " passed with the fault " << fault;
      if (f.r < 1)  // the subtle control is near the bound, not far past it
        EXPECT_LT(ratio, 100) << hr::dtype_name(dt) << " " << o.name << ": NMSE " << ratio << "x the bound";
      testing::Test::RecordProperty(fmt::format("{}_{}_nmse_over_bound_{}", hr::dtype_name(dt), o.name, fault),
                                    fmt::format("{:.3g}", ratio));
    }
  }
}

// A fault of the emulated hardware that lets threads on (a barrier or a copy wait),
// by name: the control of the check that both schedules give the same bits.
struct OrderFault {
  const char* what;
  emu::Fault fault;
};

// Each order fault makes the two schedules give different bits, and without a fault
// they give the same; each count of elements differing is recorded as
// <dtype>_elements_differing_skip_<what>.
inline void expect_order_faults_caught(const RunFor& run, DType dt, const Problem& p, const Inputs& x,
                                       std::initializer_list<OrderFault> faults) {
  for (const OrderFault& f : faults) {
    const BitDiffs d = bit_diffs(run(dt, p, x.q, x.k, x.v, x.g, kFirstSchedule, f.fault),
                                 run(dt, p, x.q, x.k, x.v, x.g, kSecondSchedule, f.fault));
    EXPECT_GT(d.total(), 0u) << hr::dtype_name(dt) << ": both schedules gave the same bits with " << f.what
                             << " skipped";
    testing::Test::RecordProperty(fmt::format("{}_elements_differing_skip_{}", hr::dtype_name(dt), f.what),
                                  fmt::format("{}", d.total()));
  }
  expect_same_bits(run(dt, p, x.q, x.k, x.v, x.g, kFirstSchedule, {}),
                   run(dt, p, x.q, x.k, x.v, x.g, kSecondSchedule, {}), "no fault");
}

}  // namespace hr::test::attn
