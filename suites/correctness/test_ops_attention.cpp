// Attention: OPS-1 (naive and memory-efficient forward against float64, with
// causal, padding and packed-segment masks), OPS-2 (both backwards against float64
// central finite differences), PK-4 (memory-efficient equals naive in fp32; peak
// activation bytes against T fit exponents ~2 naive, ~1 memory-efficient), DET-1,
// the [B, T, H*D] <-> [B, H, T, D] head moves, and the GPU's tensor-core kernels
// (fp16, bf16) against float64, finite differences and the scalar kernels.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "harness/check.hpp"
#include "harness/compare.hpp"
#include "harness/fit.hpp"
#include "harness/kernel_calls.hpp"
#include "harness/tensor.hpp"
#include "kernels/attention/attention.hpp"
#include "kernels/attention/attention_ref.hpp"
#include "kernels/common/float16.hpp"
#include "kernels/common/op_fault.hpp"
#if HEADROOM_HAVE_CUDA
#include "kernels/attention/attention_cuda.hpp"
#endif
#include "suites/common/finite_diff.hpp"
#include "suites/common/op_check.hpp"
#include "suites/common/attention_masks.hpp"
#include "suites/common/test_support.hpp"
#include "harness/tolerances.hpp"

namespace hr {
namespace {

using ops::AttentionImpl;
using test::BackendDType;

using test::kAllMasks;
using test::mask_name;
using test::MaskKind;

// A mask on the device and the same mask as host vectors for the reference.
struct Mask {
  ops::AttnMask dev;
  bool causal = false;
  std::vector<int32_t> kv_len, seg;
};

// Padding: batch row b keeps T - 3b - 1 keys (at least 1, at most T). Packing:
// sequences of lengths 5, 7, 1, 9, ... (a length-1 sequence sees only itself).
Mask make_mask(Device& dev, MaskKind kind, int64_t B, int64_t T) {
  Mask m;
  m.causal = test::is_causal(kind);
  m.dev.causal = m.causal;
  if (test::has_key_lengths(kind)) {
    for (int64_t b = 0; b < B; ++b) m.kv_len.push_back(static_cast<int32_t>(std::max<int64_t>(1, T - 3 * b - 1)));
    m.dev.key_valid_len = Tensor::from_host_i32(dev, m.kv_len, {B}, Consumer::activations);
  }
  if (test::has_segments(kind)) {
    const int lens[] = {5, 7, 1, 9, 3};
    for (int64_t b = 0; b < B; ++b) {
      int32_t id = 0;
      int used = 0, li = static_cast<int>(b);
      for (int64_t t = 0; t < T; ++t) {
        if (used == lens[li % 5]) {
          ++id;
          ++li;
          used = 0;
        }
        m.seg.push_back(id);
        ++used;
      }
    }
    m.dev.segment_ids = Tensor::from_host_i32(dev, m.seg, {B, T}, Consumer::activations);
  }
  return m;
}

struct Qkv {
  Tensor q, k, v;
  std::vector<double> qh, kh, vh;  // stored values
};

Qkv random_qkv(Device& dev, Shape shape, DType dt, uint64_t seed) {
  Qkv x;
  const size_t n = static_cast<size_t>(shape_numel(shape));
  // Scores of order a few units: a softmax that is neither flat nor one-hot.
  x.q = Tensor::from_host(dev, test::random_nonzero(n, seed, -2.f, 2.f), shape, dt, Consumer::activations);
  x.k = Tensor::from_host(dev, test::random_nonzero(n, seed + 1, -2.f, 2.f), shape, dt, Consumer::activations);
  x.v = Tensor::from_host(dev, test::random_nonzero(n, seed + 2), shape, dt, Consumer::activations);
  x.qh = test::widen(x.q.to_host_f32());
  x.kh = test::widen(x.k.to_host_f32());
  x.vh = test::widen(x.v.to_host_f32());
  return x;
}

constexpr AttentionImpl kImpls[] = {AttentionImpl::naive, AttentionImpl::memory_efficient};

// One forward and backward pass at scale 0.2 with output gradient g.
struct Pass {
  Tensor out, dq, dk, dv;
};
Pass forward_backward(Device& dev, AttentionImpl impl, const Qkv& x, const Mask& m, const Tensor& g, Shape shape,
                      DType dt) {
  Pass p;
  for (Tensor* t : {&p.out, &p.dq, &p.dk, &p.dv}) *t = Tensor::empty(dev, shape, dt, Consumer::activations);
  ops::AttentionSaved saved;
  ops::attention_forward(impl, x.q, x.k, x.v, m.dev, 0.2f, p.out, saved, Consumer::activations);
  ops::attention_backward(impl, x.q, x.k, x.v, p.out, g, m.dev, 0.2f, saved, p.dq, p.dk, p.dv);
  return p;
}

class AttentionOps : public testing::TestWithParam<BackendDType> {};

TEST_P(AttentionOps, ForwardMatchesFloat64ReferenceUnderEveryMask) {
  HR_TEST_DEVICE(dev, GetParam().backend);
  const DType dt = GetParam().dtype;
  double worst = 0;
  uint64_t seed = 1000;
  for (auto [T, D] : {std::pair<int64_t, int64_t>{1, 16}, {17, 24}, {129, 16}, {70, 64}})
    for (MaskKind mk : kAllMasks)
      for (AttentionImpl impl : kImpls) {
        const int64_t B = 2, H = 3;
        const float scale = 1.f / std::sqrt(static_cast<float>(D));
        Qkv x = random_qkv(dev, {B, H, T, D}, dt, seed += 5);
        Mask m = make_mask(dev, mk, B, T);
        test::Guarded out(dev, {B, H, T, D}, dt);
        ops::AttentionSaved saved;
        ops::attention_forward(impl, x.q, x.k, x.v, m.dev, scale, out.tensor(), saved, Consumer::activations);
        const auto want =
            ref::attention_forward(x.qh, x.kh, x.vh, {B, H, T, D}, m.causal, m.kv_len, m.seg, scale);
        const std::string what = fmt::format("{} T {} D {} mask {}", ops::attention_impl_name(impl), T, D,
                                             mask_name(mk));
        EXPECT_TRUE(test::nmse_within(out.values(), want, tol::kAttentionNmse(dt), what));
        EXPECT_TRUE(out.guards_intact()) << what;
        worst = std::max(worst, test::nmse(out.values(), want));
      }
  RecordProperty("worst_nmse", fmt::format("{:.3g}", worst));
}

TEST_P(AttentionOps, RowsWithNoVisibleKeyGiveZeros) {
  HR_TEST_DEVICE(dev, GetParam().backend);
  const DType dt = GetParam().dtype;
  // key_valid_len 0 masks every key of batch row 1: zeros, not NaN, in both forms;
  // batch row 0's length past T sees every key.
  const int64_t B = 2, H = 2, T = 33, D = 16;
  Qkv x = random_qkv(dev, {B, H, T, D}, dt, 77);
  ops::AttnMask mask;
  mask.causal = false;
  mask.key_valid_len = Tensor::from_host_i32(dev, {static_cast<int32_t>(T + 9), 0}, {B}, Consumer::activations);
  for (AttentionImpl impl : kImpls) {
    Tensor out = Tensor::empty(dev, {B, H, T, D}, dt, Consumer::activations);
    ops::AttentionSaved saved;
    ops::attention_forward(impl, x.q, x.k, x.v, mask, 0.25f, out, saved, Consumer::activations);
    const auto o = out.to_host_f32();
    const auto want = ref::attention_forward(x.qh, x.kh, x.vh, {B, H, T, D}, false,
                                             {static_cast<int32_t>(T + 9), 0}, {}, 0.25);
    EXPECT_TRUE(test::nmse_within(o, want, tol::kAttentionNmse(dt), ops::attention_impl_name(impl)));
    for (size_t i = o.size() / 2; i < o.size(); ++i) ASSERT_EQ(o[i], 0.f) << ops::attention_impl_name(impl);
  }
}

// OPS-2: gradients of L = <attention(q, k, v), g> against central finite
// differences of the float64 reference, for both forms.
TEST_P(AttentionOps, BackwardMatchesFiniteDifferences) {
  HR_TEST_DEVICE(dev, GetParam().backend);
  const DType dt = GetParam().dtype;
  const int64_t B = 2, H = 2, T = 11, D = 4;
  const float scale = 0.5f;
  double worst = 0;
  uint64_t seed = 2000;
  for (MaskKind mk : {MaskKind::none, MaskKind::causal_padding, MaskKind::causal_packed, MaskKind::padding_packed})
    for (AttentionImpl impl : kImpls) {
      Qkv x = random_qkv(dev, {B, H, T, D}, dt, seed += 5);
      Mask m = make_mask(dev, mk, B, T);
      const auto gv = test::random_nonzero(static_cast<size_t>(B * H * T * D), seed + 3);
      Tensor g = Tensor::from_host(dev, gv, {B, H, T, D}, dt, Consumer::activations);
      const auto gh = test::widen(g.to_host_f32());
      Tensor out = Tensor::empty(dev, {B, H, T, D}, dt, Consumer::activations);
      ops::AttentionSaved saved;
      ops::attention_forward(impl, x.q, x.k, x.v, m.dev, scale, out, saved, Consumer::activations);
      test::Guarded dq(dev, {B, H, T, D}, dt), dk(dev, {B, H, T, D}, dt), dv(dev, {B, H, T, D}, dt);
      ops::attention_backward(impl, x.q, x.k, x.v, out, g, m.dev, scale, saved, dq.tensor(), dk.tensor(),
                              dv.tensor());
      const ref::AttentionShape sh{B, H, T, D};
      auto loss = [&](const std::vector<double>& q, const std::vector<double>& k, const std::vector<double>& v) {
        return test::dot(ref::attention_forward(q, k, v, sh, m.causal, m.kv_len, m.seg, scale), gh);
      };
      const auto gq = test::finite_diff_grad([&](const std::vector<double>& q) { return loss(q, x.kh, x.vh); }, x.qh);
      const auto gk = test::finite_diff_grad([&](const std::vector<double>& k) { return loss(x.qh, k, x.vh); }, x.kh);
      const auto gvv = test::finite_diff_grad([&](const std::vector<double>& v) { return loss(x.qh, x.kh, v); }, x.vh);
      const std::string what = fmt::format("{} mask {}", ops::attention_impl_name(impl), mask_name(mk));
      const double tol = tol::kAttentionGradNmse(dt);
      EXPECT_TRUE(test::nmse_within(dq.values(), gq, tol, "dq " + what));
      EXPECT_TRUE(test::nmse_within(dk.values(), gk, tol, "dk " + what));
      EXPECT_TRUE(test::nmse_within(dv.values(), gvv, tol, "dv " + what));
      EXPECT_TRUE(dq.guards_intact() && dk.guards_intact() && dv.guards_intact()) << what;
      worst = std::max({worst, test::nmse(dq.values(), gq), test::nmse(dk.values(), gk),
                        test::nmse(dv.values(), gvv)});
    }
  RecordProperty("worst_grad_nmse", fmt::format("{:.3g}", worst));
}

TEST_P(AttentionOps, ForwardAndBackwardAreBitwiseRepeatable) {
  HR_TEST_DEVICE(dev, GetParam().backend);
  const DType dt = GetParam().dtype;
  const int64_t B = 2, H = 2, T = 97, D = 32;
  Qkv x = random_qkv(dev, {B, H, T, D}, dt, 3000);
  Mask m = make_mask(dev, MaskKind::causal_packed, B, T);
  Tensor g = Tensor::from_host(dev, test::random_nonzero(static_cast<size_t>(B * H * T * D), 3001), {B, H, T, D}, dt,
                               Consumer::activations);
  for (AttentionImpl impl : kImpls) {
    std::vector<std::vector<uint8_t>> first;
    for (int run = 0; run < 2; ++run) {
      const Pass p = forward_backward(dev, impl, x, m, g, {B, H, T, D}, dt);
      std::vector<std::vector<uint8_t>> now = {p.out.to_host_bytes(), p.dq.to_host_bytes(), p.dk.to_host_bytes(),
                                               p.dv.to_host_bytes()};
      if (run == 0)
        first = now;
      else
        for (size_t i = 0; i < now.size(); ++i)
          EXPECT_EQ(bitwise_mismatches(first[i], now[i]), 0u) << ops::attention_impl_name(impl) << " tensor " << i;
    }
  }
}

// PK-4's subtle control (ops::OpFault::lse_offset): the memory-efficient form's
// saved log-sum-exp off by d leaves the output as it was and makes the backward
// pass's dV e^-d of the right one; naive attention saves none and is untouched.
TEST_P(AttentionOps, ALogSumExpOffsetScalesTheMemoryEfficientBackward) {
  HR_TEST_DEVICE(dev, GetParam().backend);
  const DType dt = GetParam().dtype;
  if (dt != DType::f32) GTEST_SKIP() << "the ratio is judged in fp32 (16-bit storage rounds it)";
  const int64_t B = 2, H = 2, T = 97, D = 32;
  Qkv x = random_qkv(dev, {B, H, T, D}, dt, 3100);
  Mask m = make_mask(dev, MaskKind::causal_packed, B, T);
  Tensor g = Tensor::from_host(dev, test::random_nonzero(static_cast<size_t>(B * H * T * D), 3101), {B, H, T, D}, dt,
                               Consumer::activations);
  const double offset = 0x1p-6;
  for (AttentionImpl impl : kImpls) {
    std::vector<float> out_of[2], dv_of[2];
    for (int faulty = 0; faulty < 2; ++faulty) {
      ops::OpFault f;
      if (faulty) {
        f.op = "attention_forward";
        f.lse_offset = offset;
      }
      ops::ScopedOpFault fault(f);
      const Pass p = forward_backward(dev, impl, x, m, g, {B, H, T, D}, dt);
      out_of[faulty] = p.out.to_host_f32();
      dv_of[faulty] = p.dv.to_host_f32();
    }
    const char* name = ops::attention_impl_name(impl);
    EXPECT_EQ(out_of[0], out_of[1]) << name;
    const double want = impl == AttentionImpl::naive ? 1.0 : std::exp(-offset);
    // Elements of |dV| above 1e-2 only: a smaller one is a near-cancelled sum of
    // terms up to ~0.5, whose rounding (a GPU's expf is within 2 ulp, glibc's within
    // 1) the ratio would amplify some 300-fold, to the order of the bound.
    double worst = 0;
    size_t compared = 0;
    for (size_t i = 0; i < dv_of[0].size(); ++i)
      if (std::fabs(dv_of[0][i]) > 1e-2f) {
        worst = std::max(worst, std::fabs(dv_of[1][i] / dv_of[0][i] - want));
        ++compared;
      }
    EXPECT_GT(compared, dv_of[0].size() / 2) << name;
    EXPECT_LT(worst, 1e-4) << name << ": dV against e^-offset x dV (1 - e^-offset = 0.0155)";
  }
}

TEST_P(AttentionOps, SplitAndMergeHeadsMoveEveryElement) {
  HR_TEST_DEVICE(dev, GetParam().backend);
  const DType dt = GetParam().dtype;
  const int64_t B = 3, T = 17, H = 4, D = 5;
  const auto xv = test::random_nonzero(static_cast<size_t>(B * T * H * D), 4000);
  Tensor x = Tensor::from_host(dev, xv, {B, T, H * D}, dt, Consumer::activations);
  const auto xs = x.to_host_f32();
  test::Guarded y(dev, {B, H, T, D}, dt);
  ops::split_heads(x, H, y.tensor());
  const auto yv = y.values();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t t = 0; t < T; ++t)
        for (int64_t d = 0; d < D; ++d)
          ASSERT_EQ(yv[((b * H + h) * T + t) * D + d], xs[((b * T + t) * H + h) * D + d]) << b << h << t << d;
  EXPECT_TRUE(y.guards_intact());
  test::Guarded back(dev, {B, T, H * D}, dt);
  ops::merge_heads(y.tensor(), back.tensor());
  EXPECT_EQ(bitwise_mismatches(back.tensor().to_host_bytes(), x.to_host_bytes()), 0u);
  EXPECT_TRUE(back.guards_intact());
  Tensor wrong = Tensor::empty(dev, {B, H, T, D + 1}, dt, Consumer::activations);
  EXPECT_THROW(ops::split_heads(x, H, wrong), Error);
  EXPECT_THROW(ops::split_heads(x, 3, y.tensor()), Error);  // 3 does not divide H*D = 20
}

TEST_P(AttentionOps, BadArgumentsThrow) {
  HR_TEST_DEVICE(dev, GetParam().backend);
  const DType dt = GetParam().dtype;
  Qkv x = random_qkv(dev, {1, 2, 8, 4}, dt, 5000);
  Tensor k_short = Tensor::zeros(dev, {1, 2, 7, 4}, dt, Consumer::activations);
  Tensor out = Tensor::empty(dev, {1, 2, 8, 4}, dt, Consumer::activations);
  ops::AttnMask mask;
  ops::AttentionSaved saved;
  EXPECT_THROW(ops::attention_forward(AttentionImpl::memory_efficient, x.q, k_short, x.v, mask, 1.f, out, saved,
                                      Consumer::activations),
               Error);
  ops::AttnMask bad_len;
  bad_len.key_valid_len = Tensor::from_host_i32(dev, {8, 8}, {2}, Consumer::activations);  // B is 1
  EXPECT_THROW(ops::attention_forward(AttentionImpl::memory_efficient, x.q, x.k, x.v, bad_len, 1.f, out, saved,
                                      Consumer::activations),
               Error);
  // The backward pass of one form cannot run on what the other form saved.
  ops::attention_forward(AttentionImpl::memory_efficient, x.q, x.k, x.v, mask, 1.f, out, saved,
                         Consumer::activations);
  Tensor dq = Tensor::empty(dev, {1, 2, 8, 4}, dt, Consumer::activations), dk = dq.clone(), dv = dq.clone();
  EXPECT_THROW(ops::attention_backward(AttentionImpl::naive, x.q, x.k, x.v, out, out, mask, 1.f, saved, dq, dk, dv),
               Error);
}

INSTANTIATE_TEST_SUITE_P(Backends, AttentionOps, testing::ValuesIn(test::all_backend_dtypes()), test::param_name);

// ---- PK-4: the two forms agree, and their memory scales differently --------------------

class AttentionForms : public testing::TestWithParam<BackendKind> {};

struct FormResult {
  std::vector<float> out, dq, dk, dv;
};

FormResult run_form(Device& dev, AttentionImpl impl, const Qkv& x, const Tensor& g, const ops::AttnMask& mask,
                    float scale) {
  const Shape shape = x.q.shape();
  Tensor out = Tensor::empty(dev, shape, DType::f32, Consumer::activations);
  Tensor dq = Tensor::empty(dev, shape, DType::f32, Consumer::activations), dk = dq.clone(), dv = dq.clone();
  ops::AttentionSaved saved;
  ops::attention_forward(impl, x.q, x.k, x.v, mask, scale, out, saved, Consumer::activations);
  ops::attention_backward(impl, x.q, x.k, x.v, out, g, mask, scale, saved, dq, dk, dv);
  return {out.to_host_f32(), dq.to_host_f32(), dk.to_host_f32(), dv.to_host_f32()};
}

// The relative L2 error of each of got's outputs against want's, by name.
std::array<std::pair<const char*, double>, 4> form_errors(const FormResult& got, const FormResult& want) {
  return {{{"out", rel_l2(got.out, want.out)},
           {"dq", rel_l2(got.dq, want.dq)},
           {"dk", rel_l2(got.dk, want.dk)},
           {"dv", rel_l2(got.dv, want.dv)}}};
}

// At each head-dim bucket of the GPU's scalar kernels (32, 64, 128), where a row
// has one thread, two or four (the backward at 128), and at head dims below their
// bucket's: 45 (not whole 4-element pieces) and 100.
TEST_P(AttentionForms, MemoryEfficientEqualsNaiveInFp32) {
  HR_TEST_DEVICE(dev, GetParam());
  const int64_t B = 2, H = 2, T = 200;  // T not a multiple of any chunk size
  double worst = 0;
  uint64_t seed = 6000;
  for (const int64_t D : {32, 45, 64, 100, 128}) {
    const float scale = 1.f / std::sqrt(static_cast<float>(D));
    Qkv x = random_qkv(dev, {B, H, T, D}, DType::f32, seed += 2);
    Tensor g = Tensor::from_host(dev, test::random_nonzero(static_cast<size_t>(B * H * T * D), seed + 1),
                                 {B, H, T, D}, DType::f32, Consumer::activations);
    for (MaskKind mk :
         {MaskKind::causal, MaskKind::causal_padding, MaskKind::causal_packed, MaskKind::padding_packed}) {
      Mask m = make_mask(dev, mk, B, T);
      const FormResult naive = run_form(dev, AttentionImpl::naive, x, g, m.dev, scale);
      const FormResult eff = run_form(dev, AttentionImpl::memory_efficient, x, g, m.dev, scale);
      for (auto [name, e] : form_errors(eff, naive)) {
        EXPECT_LE(e, tol::kAttentionImplsRelL2) << name << " D " << D << " mask " << mask_name(mk);
        worst = std::max(worst, e);
      }
    }
  }
  RecordProperty("worst_rel_l2", fmt::format("{:.3g}", worst));
  // Negative control: naive attention given packing without its boundary mask
  // differs from the masked memory-efficient form far beyond the bound.
  const int64_t D = 32;
  const float scale = 1.f / std::sqrt(static_cast<float>(D));
  Qkv x = random_qkv(dev, {B, H, T, D}, DType::f32, 6000);
  Tensor g = Tensor::from_host(dev, test::random_nonzero(static_cast<size_t>(B * H * T * D), 6001), {B, H, T, D},
                               DType::f32, Consumer::activations);
  Mask packed = make_mask(dev, MaskKind::causal_packed, B, T);
  ops::AttnMask no_boundary;
  no_boundary.causal = true;
  const FormResult leaky = run_form(dev, AttentionImpl::naive, x, g, no_boundary, scale);
  const FormResult eff = run_form(dev, AttentionImpl::memory_efficient, x, g, packed.dev, scale);
  EXPECT_GT(rel_l2(leaky.out, eff.out), 100 * tol::kAttentionImplsRelL2);
  // The check's controls, by the forward's fault switch armed for the memory-efficient
  // form's pass alone: its output off by a relative r (alternating signs: out's
  // error is r), or its saved log-sum-exp off by r (each probability the backward
  // recomputes off by about r: the gradients'), grossly at r = 0.5, subtly at 3e-4
  // (about 30x the bound).
  const FormResult naive = run_form(dev, AttentionImpl::naive, x, g, packed.dev, scale);
  for (const double r : {0.5, 3e-4}) {
    ops::OpFault off_out, off_lse;
    off_out.op = off_lse.op = "attention_forward";
    off_out.output_rel_error = r;
    off_lse.lse_offset = r;
    FormResult broken_out, broken_lse;
    {
      const ops::ScopedOpFault armed(off_out);
      broken_out = run_form(dev, AttentionImpl::memory_efficient, x, g, packed.dev, scale);
    }
    {
      const ops::ScopedOpFault armed(off_lse);
      broken_lse = run_form(dev, AttentionImpl::memory_efficient, x, g, packed.dev, scale);
    }
    // The output of the first fault's pass, the gradients of the second's.
    const FormResult broken{broken_out.out, broken_lse.dq, broken_lse.dk, broken_lse.dv};
    for (auto [name, e] : form_errors(broken, naive)) {
      EXPECT_GT(e, tol::kAttentionImplsRelL2) << name << " passed with the fault at r = " << r;
      if (r < 0.1) EXPECT_LT(e, 100 * tol::kAttentionImplsRelL2) << name << ": the subtle control is not near the bound";
      RecordProperty(fmt::format("{}_rel_l2_over_bound_at_r_{:.3g}", name, r),
                     fmt::format("{:.3g}", e / tol::kAttentionImplsRelL2));
    }
  }
}

// Peak bytes above what existed before: activations kept by the forward pass (what
// the backward pass needs), and every consumer over forward + backward.
struct PeakBytes {
  double activations, total;
};

PeakBytes measure_step(Device& dev, AttentionImpl impl, int64_t T) {
  const int64_t B = 1, H = 2, D = 16;
  Qkv x = random_qkv(dev, {B, H, T, D}, DType::f32, 7000 + T);
  Tensor g = Tensor::from_host(dev, test::random_nonzero(static_cast<size_t>(B * H * T * D), 7001), {B, H, T, D},
                               DType::f32, Consumer::activations);
  ops::AttnMask mask;  // causal
  dev.synchronize();
  const MemorySnapshot before = dev.memory().snapshot();
  dev.memory().reset_peak();
  double activations = 0;
  {
    Tensor out = Tensor::empty(dev, {B, H, T, D}, DType::f32, Consumer::activations);
    ops::AttentionSaved saved;
    ops::attention_forward(impl, x.q, x.k, x.v, mask, 0.25f, out, saved, Consumer::activations);
    dev.synchronize();
    activations = static_cast<double>(dev.memory().snapshot().peak(Consumer::activations) -
                                      before.current(Consumer::activations));
    Tensor dq = Tensor::empty(dev, {B, H, T, D}, DType::f32, Consumer::activations), dk = dq.clone(),
           dv = dq.clone();
    ops::attention_backward(impl, x.q, x.k, x.v, out, g, mask, 0.25f, saved, dq, dk, dv);
    dev.synchronize();
  }
  const MemorySnapshot after = dev.memory().snapshot();
  return {activations, static_cast<double>(after.total_peak_bytes - before.total_current_bytes)};
}

TEST_P(AttentionForms, PeakBytesScaleQuadraticallyNaiveAndLinearlyMemoryEfficient) {
  HR_TEST_DEVICE(dev, GetParam());
  const std::vector<double> ts = {256, 512, 1024, 2048};
  for (AttentionImpl impl : kImpls) {
    std::vector<double> act, total;
    for (double t : ts) {
      const PeakBytes p = measure_step(dev, impl, static_cast<int64_t>(t));
      act.push_back(p.activations);
      total.push_back(p.total);
    }
    const PowerFit fa = fit_power_law(ts, act), ft = fit_power_law(ts, total);
    const std::string name = ops::attention_impl_name(impl);
    RecordProperty(name + "_activation_exponent", fmt::format("{:.3f}", fa.exponent));
    RecordProperty(name + "_total_exponent", fmt::format("{:.3f}", ft.exponent));
    if (impl == AttentionImpl::naive) {
      EXPECT_GT(fa.exponent, tol::kNaiveAttentionMinExponent) << "activation bytes";
      EXPECT_GT(ft.exponent, tol::kNaiveAttentionMinExponent) << "all bytes of the step";
    } else {
      EXPECT_LT(fa.exponent, tol::kMemEfficientAttentionMaxExponent) << "activation bytes";
      EXPECT_LT(ft.exponent, tol::kMemEfficientAttentionMaxExponent) << "all bytes of the step";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, AttentionForms, testing::Values(BackendKind::cpu, BackendKind::cuda),
                         test::backend_param_name);

// ---- the tensor-core kernels (CUDA, fp16 and bf16) ---------------------------------------

// Empty when `kernel` can run dt at head dim D on dev, else why not (no CUDA backend
// built, an older GPU, too little shared memory; for cuDNN, no library or no graph).
std::string why_not(Device& dev, ops::GpuAttentionKernel kernel, DType dt, int64_t D) {
  std::string why;
  return ops::gpu_attention_kernel_available(dev, kernel, dt, D, &why) ? std::string() : why;
}

#define HR_TENSOR_CORE_DEVICE(dev, dt)                                                                      \
  HR_TEST_DEVICE(dev, BackendKind::cuda);                                                                   \
  if (const std::string hr_tc_why = why_not(dev, ops::GpuAttentionKernel::tensor_core, (dt), 128);          \
      !hr_tc_why.empty())                                                                                   \
  GTEST_SKIP() << "tensor-core attention unavailable: " << hr_tc_why

class AttentionTensorCore : public testing::TestWithParam<DType> {};

// Rows of D a multiple of 8 at a 16-byte aligned base take the 16-byte staging
// (cp.async in, vector stores out); any other D, or a base 2 bytes off (a view one
// element into its storage), takes the element-by-element copies.
enum class Staging { aligned, misaligned };

// q, k and v of x copied into views one element into their storage (2 bytes off
// 16-byte alignment), kept alive by the returned guards.
struct MisalignedQkv {
  test::Guarded q, k, v;
  MisalignedQkv(Device& dev, const Qkv& x, Shape shape, DType dt)
      : q(dev, shape, dt, 1), k(dev, shape, dt, 1), v(dev, shape, dt, 1) {
    q.tensor().copy_from(x.q), k.tensor().copy_from(x.k), v.tensor().copy_from(x.v);
  }
};

// OPS-1 for the tensor-core forward: every mask, T across tile edges (1, 17, 64,
// 129, 200) and past the pipeline's first steps (520: 9 key tiles), every head-dim
// bucket, D a multiple of 8 (16, 24, 32, 40, 64, 128) and not (20, 100), and one
// shape of each staging at a misaligned base.
TEST_P(AttentionTensorCore, ForwardMatchesFloat64ReferenceUnderEveryMask) {
  const DType dt = GetParam();
  HR_TENSOR_CORE_DEVICE(dev, dt);
  const ops::ScopedGpuAttentionKernel tc(ops::GpuAttentionKernel::tensor_core);
  double worst = 0;
  uint64_t seed = 8000;
  struct Case {
    int64_t T, D;
    Staging staging;
  };
  for (const Case c : {Case{1, 16, Staging::aligned}, {17, 24, Staging::aligned}, {64, 32, Staging::aligned},
                       {129, 64, Staging::aligned}, {200, 40, Staging::aligned}, {70, 128, Staging::aligned},
                       {45, 20, Staging::aligned}, {81, 100, Staging::aligned}, {520, 64, Staging::aligned},
                       {97, 64, Staging::misaligned}, {66, 20, Staging::misaligned}})
    for (MaskKind mk : kAllMasks) {
      const int64_t B = 2, H = 3, T = c.T, D = c.D;
      const float scale = 1.f / std::sqrt(static_cast<float>(D));
      Qkv x = random_qkv(dev, {B, H, T, D}, dt, seed += 5);
      std::optional<MisalignedQkv> off;
      if (c.staging == Staging::misaligned) off.emplace(dev, x, Shape{B, H, T, D}, dt);
      Mask m = make_mask(dev, mk, B, T);
      // The output 2 bytes off as well when the inputs are.
      test::Guarded out(dev, {B, H, T, D}, dt, c.staging == Staging::misaligned ? 65 : 64);
      ops::AttentionSaved saved;
      ops::attention_forward(AttentionImpl::memory_efficient, off ? off->q.tensor() : x.q,
                             off ? off->k.tensor() : x.k, off ? off->v.tensor() : x.v, m.dev, scale, out.tensor(),
                             saved, Consumer::activations);
      const auto want = ref::attention_forward(x.qh, x.kh, x.vh, {B, H, T, D}, m.causal, m.kv_len, m.seg, scale);
      const std::string what = fmt::format("tensor cores T {} D {} mask {}{}", T, D, mask_name(mk),
                                           off ? " (misaligned)" : "");
      EXPECT_TRUE(test::nmse_within(out.values(), want, tol::kAttentionNmse(dt), what));
      EXPECT_TRUE(out.guards_intact()) << what;
      worst = std::max(worst, test::nmse(out.values(), want));
    }
  RecordProperty("worst_nmse", fmt::format("{:.3g}", worst));
}

// OPS-2 for the tensor-core backward: against central finite differences of the
// float64 reference (small shapes: the differences cost T^2 D per element).
TEST_P(AttentionTensorCore, BackwardMatchesFiniteDifferences) {
  const DType dt = GetParam();
  HR_TENSOR_CORE_DEVICE(dev, dt);
  const ops::ScopedGpuAttentionKernel tc(ops::GpuAttentionKernel::tensor_core);
  double worst = 0;
  uint64_t seed = 8500;
  for (auto [T, D] : {std::pair<int64_t, int64_t>{11, 4}, {37, 8}})
    for (MaskKind mk : {MaskKind::none, MaskKind::causal_padding, MaskKind::causal_packed, MaskKind::padding_packed}) {
      const int64_t B = 2, H = 2;
      const float scale = 0.5f;
      Qkv x = random_qkv(dev, {B, H, T, D}, dt, seed += 5);
      Mask m = make_mask(dev, mk, B, T);
      Tensor g = Tensor::from_host(dev, test::random_nonzero(static_cast<size_t>(B * H * T * D), seed + 3),
                                   {B, H, T, D}, dt, Consumer::activations);
      const auto gh = test::widen(g.to_host_f32());
      Tensor out = Tensor::empty(dev, {B, H, T, D}, dt, Consumer::activations);
      ops::AttentionSaved saved;
      ops::attention_forward(AttentionImpl::memory_efficient, x.q, x.k, x.v, m.dev, scale, out, saved,
                             Consumer::activations);
      test::Guarded dq(dev, {B, H, T, D}, dt), dk(dev, {B, H, T, D}, dt), dv(dev, {B, H, T, D}, dt);
      ops::attention_backward(AttentionImpl::memory_efficient, x.q, x.k, x.v, out, g, m.dev, scale, saved,
                              dq.tensor(), dk.tensor(), dv.tensor());
      const ref::AttentionShape sh{B, H, T, D};
      auto loss = [&](const std::vector<double>& q, const std::vector<double>& k, const std::vector<double>& v) {
        return test::dot(ref::attention_forward(q, k, v, sh, m.causal, m.kv_len, m.seg, scale), gh);
      };
      const auto gq = test::finite_diff_grad([&](const std::vector<double>& q) { return loss(q, x.kh, x.vh); }, x.qh);
      const auto gk = test::finite_diff_grad([&](const std::vector<double>& k) { return loss(x.qh, k, x.vh); }, x.kh);
      const auto gv = test::finite_diff_grad([&](const std::vector<double>& v) { return loss(x.qh, x.kh, v); }, x.vh);
      const std::string what = fmt::format("tensor cores T {} D {} mask {}", T, D, mask_name(mk));
      const double tol = tol::kAttentionGradNmse(dt);
      EXPECT_TRUE(test::nmse_within(dq.values(), gq, tol, "dq " + what));
      EXPECT_TRUE(test::nmse_within(dk.values(), gk, tol, "dk " + what));
      EXPECT_TRUE(test::nmse_within(dv.values(), gv, tol, "dv " + what));
      EXPECT_TRUE(dq.guards_intact() && dk.guards_intact() && dv.guards_intact()) << what;
      worst = std::max({worst, test::nmse(dq.values(), gq), test::nmse(dk.values(), gk), test::nmse(dv.values(), gv)});
    }
  RecordProperty("worst_grad_nmse", fmt::format("{:.3g}", worst));
}

// At the head dims finite differences cannot afford (64, 128, and 40 across a
// bucket; 100, not a multiple of 8), and past the pipeline's first steps (T 520: 9
// key tiles), the tensor-core gradients against the scalar kernels' (another code
// path: a thread or a few per row, fp32 products), both in the storage format, under every
// mask: the steps wholly inside the allowed keys (no mask, below the causal
// diagonal, within the key lengths) skip the per-element test, the others take it.
TEST_P(AttentionTensorCore, BackwardAgreesWithScalarKernelsAtLargeHeadDims) {
  const DType dt = GetParam();
  HR_TENSOR_CORE_DEVICE(dev, dt);
  double worst = 0;
  uint64_t seed = 9000;
  for (auto [T, D] : {std::pair<int64_t, int64_t>{130, 64}, {97, 128}, {200, 40}, {75, 100}, {520, 64}})
    for (MaskKind mk : kAllMasks) {
      const int64_t B = 2, H = 2;
      const float scale = 1.f / std::sqrt(static_cast<float>(D));
      Qkv x = random_qkv(dev, {B, H, T, D}, dt, seed += 5);
      Mask m = make_mask(dev, mk, B, T);
      Tensor g = Tensor::from_host(dev, test::random_nonzero(static_cast<size_t>(B * H * T * D), seed + 3),
                                   {B, H, T, D}, dt, Consumer::activations);
      auto run = [&](ops::GpuAttentionKernel kernel) {
        const ops::ScopedGpuAttentionKernel selected(kernel);  // restored on a throw too
        Tensor out = Tensor::empty(dev, {B, H, T, D}, dt, Consumer::activations);
        Tensor dq = Tensor::empty(dev, {B, H, T, D}, dt, Consumer::activations), dk = dq.clone(), dv = dq.clone();
        ops::AttentionSaved saved;
        ops::attention_forward(AttentionImpl::memory_efficient, x.q, x.k, x.v, m.dev, scale, out, saved,
                               Consumer::activations);
        ops::attention_backward(AttentionImpl::memory_efficient, x.q, x.k, x.v, out, g, m.dev, scale, saved, dq, dk,
                                dv);
        return std::vector<std::vector<double>>{test::widen(dq.to_host_f32()), test::widen(dk.to_host_f32()),
                                                test::widen(dv.to_host_f32())};
      };
      const auto scalar = run(ops::GpuAttentionKernel::scalar);
      const auto tensor = run(ops::GpuAttentionKernel::tensor_core);
      const char* names[] = {"dq", "dk", "dv"};
      for (int i = 0; i < 3; ++i) {
        const std::vector<float> got(tensor[i].begin(), tensor[i].end());
        const std::string what = fmt::format("{} T {} D {} mask {}", names[i], T, D, mask_name(mk));
        EXPECT_TRUE(test::nmse_within(got, scalar[i], tol::kAttentionGradNmse(dt), what));
        worst = std::max(worst, test::nmse(got, scalar[i]));
      }
    }
  RecordProperty("worst_grad_nmse_vs_scalar", fmt::format("{:.3g}", worst));
}

TEST_P(AttentionTensorCore, ForwardAndBackwardAreBitwiseRepeatable) {
  const DType dt = GetParam();
  HR_TENSOR_CORE_DEVICE(dev, dt);
  const ops::ScopedGpuAttentionKernel tc(ops::GpuAttentionKernel::tensor_core);
  const int64_t B = 2, H = 2, T = 150, D = 64;
  Qkv x = random_qkv(dev, {B, H, T, D}, dt, 9500);
  Mask m = make_mask(dev, MaskKind::causal_packed, B, T);
  Tensor g = Tensor::from_host(dev, test::random_nonzero(static_cast<size_t>(B * H * T * D), 9501), {B, H, T, D}, dt,
                               Consumer::activations);
  std::vector<std::vector<uint8_t>> first;
  for (int run = 0; run < 2; ++run) {
    Tensor out = Tensor::empty(dev, {B, H, T, D}, dt, Consumer::activations);
    Tensor dq = Tensor::empty(dev, {B, H, T, D}, dt, Consumer::activations), dk = dq.clone(), dv = dq.clone();
    ops::AttentionSaved saved;
    ops::attention_forward(AttentionImpl::memory_efficient, x.q, x.k, x.v, m.dev, 0.2f, out, saved,
                           Consumer::activations);
    ops::attention_backward(AttentionImpl::memory_efficient, x.q, x.k, x.v, out, g, m.dev, 0.2f, saved, dq, dk, dv);
    std::vector<std::vector<uint8_t>> now = {out.to_host_bytes(), dq.to_host_bytes(), dk.to_host_bytes(),
                                             dv.to_host_bytes()};
    if (run == 0)
      first = now;
    else
      for (size_t i = 0; i < now.size(); ++i) EXPECT_EQ(bitwise_mismatches(first[i], now[i]), 0u) << "tensor " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Cuda, AttentionTensorCore, testing::Values(DType::f16, DType::bf16),
                         [](const testing::TestParamInfo<DType>& info) { return std::string(dtype_name(info.param)); });

// A causal head's largest |dS| and largest |dQ|, |dK|, |dV| in float64, per unit
// of dO (every one is linear in dO): the backward that dO's scale would ask for.
struct DsScale {
  double ds = 0, grads = 0;
};
DsScale causal_ds_scale(const Qkv& x, const std::vector<double>& g, int64_t BH, int64_t T, int64_t D, double scale) {
  DsScale out;
  for (int64_t h = 0; h < BH; ++h) {
    const size_t base = static_cast<size_t>(h * T * D);
    auto at = [&](const std::vector<double>& m, int64_t t, int64_t d) { return m[base + static_cast<size_t>(t * D + d)]; };
    std::vector<double> dq(static_cast<size_t>(T * D), 0), dk = dq, dv = dq;
    for (int64_t i = 0; i < T; ++i) {
      std::vector<double> p(static_cast<size_t>(i + 1)), dp(p.size());
      double mx = -INFINITY, z = 0, di = 0;
      for (int64_t j = 0; j <= i; ++j) {
        double s = 0;
        for (int64_t d = 0; d < D; ++d) s += at(x.qh, i, d) * at(x.kh, j, d);
        p[static_cast<size_t>(j)] = s * scale;
        mx = std::max(mx, s * scale);
      }
      for (double& v : p) z += (v = std::exp(v - mx));
      for (int64_t j = 0; j <= i; ++j) {
        p[static_cast<size_t>(j)] /= z;
        double s = 0;
        for (int64_t d = 0; d < D; ++d) s += at(g, i, d) * at(x.vh, j, d);
        dp[static_cast<size_t>(j)] = s;
        di += p[static_cast<size_t>(j)] * s;
      }
      for (int64_t j = 0; j <= i; ++j) {
        const double pij = p[static_cast<size_t>(j)], ds = pij * (dp[static_cast<size_t>(j)] - di);
        out.ds = std::max(out.ds, std::fabs(ds));
        for (int64_t d = 0; d < D; ++d) {
          dq[static_cast<size_t>(i * D + d)] += scale * ds * at(x.kh, j, d);
          dk[static_cast<size_t>(j * D + d)] += scale * ds * at(x.qh, i, d);
          dv[static_cast<size_t>(j * D + d)] += pij * at(g, i, d);
        }
      }
    }
    for (const auto* m : {&dq, &dk, &dv})
      for (double v : *m) out.grads = std::max(out.grads, std::fabs(v));
  }
  return out;
}

// Near-uniform attention (small q, k) over large values: dS = P (dP - D) grows with
// |v| while dQ and dK stay small (they scale with k and q) and dV does not grow.
Qkv wide_value_qkv(Device& dev, Shape shape, uint64_t seed) {
  Qkv x;
  const size_t n = static_cast<size_t>(shape_numel(shape));
  x.q = Tensor::from_host(dev, test::random_nonzero(n, seed, -0.25f, 0.25f), shape, DType::f16, Consumer::activations);
  x.k = Tensor::from_host(dev, test::random_nonzero(n, seed + 1, -0.25f, 0.25f), shape, DType::f16,
                          Consumer::activations);
  x.v = Tensor::from_host(dev, test::random_nonzero(n, seed + 2, -8.f, 8.f), shape, DType::f16, Consumer::activations);
  x.qh = test::widen(x.q.to_host_f32());
  x.kh = test::widen(x.k.to_host_f32());
  x.vh = test::widen(x.v.to_host_f32());
  return x;
}

// At a large loss scale a step's dS passes fp16's 65504 where the scalar kernels,
// which keep dS in fp32, stay finite. dO is scaled by the power of two that puts
// the largest |dS| past 1.25 x 65504 while every gradient stays under half of it
// (found in float64); the tensor-core backward must then be finite and agree with
// the scalar kernels.
TEST(AttentionTensorCoreCuda, Fp16BackwardStaysFiniteWhereDsPassesFp16sRange) {
  HR_TENSOR_CORE_DEVICE(dev, DType::f16);
  const int64_t B = 1, H = 2, T = 97, D = 128;
  const float scale = 1.f / std::sqrt(static_cast<float>(D));
  const Qkv x = wide_value_qkv(dev, {B, H, T, D}, 9700);
  const size_t n = static_cast<size_t>(B * H * T * D);
  std::vector<float> g1 = test::random_nonzero(n, 9703);
  for (float& v : g1) v = static_cast<float>(round_to<half_t>(v));
  const DsScale unit = causal_ds_scale(x, test::widen(g1), B * H, T, D, scale);
  int e = 0;
  while (e < 24 && unit.ds * std::ldexp(1.0, e) < 1.25 * 65504) ++e;
  ASSERT_LT(unit.grads * std::ldexp(1.0, e), 0.5 * 65504)
      << "precondition: no scale of dO overflows dS in fp16 and not the gradients (ds " << unit.ds << ", grads "
      << unit.grads << " per unit)";
  for (float& v : g1) v = std::ldexp(v, e);
  Tensor g = Tensor::from_host(dev, g1, {B, H, T, D}, DType::f16, Consumer::activations);
  Mask m = make_mask(dev, MaskKind::causal, B, T);
  auto run = [&](ops::GpuAttentionKernel kernel) {
    const ops::ScopedGpuAttentionKernel selected(kernel);  // restored on a throw too
    Tensor out = Tensor::empty(dev, {B, H, T, D}, DType::f16, Consumer::activations);
    Tensor dq = Tensor::empty(dev, {B, H, T, D}, DType::f16, Consumer::activations), dk = dq.clone(), dv = dq.clone();
    ops::AttentionSaved saved;
    ops::attention_forward(AttentionImpl::memory_efficient, x.q, x.k, x.v, m.dev, scale, out, saved,
                           Consumer::activations);
    ops::attention_backward(AttentionImpl::memory_efficient, x.q, x.k, x.v, out, g, m.dev, scale, saved, dq, dk, dv);
    return std::vector<std::vector<float>>{dq.to_host_f32(), dk.to_host_f32(), dv.to_host_f32()};
  };
  const auto scalar = run(ops::GpuAttentionKernel::scalar);
  const auto tensor = run(ops::GpuAttentionKernel::tensor_core);
  RecordProperty("do_scale_log2", testing::PrintToString(e));
  const char* names[] = {"dq", "dk", "dv"};
  for (int i = 0; i < 3; ++i) {
    SCOPED_TRACE(names[i]);
    ASSERT_TRUE(std::all_of(scalar[i].begin(), scalar[i].end(), [](float v) { return std::isfinite(v); }));
    EXPECT_TRUE(std::all_of(tensor[i].begin(), tensor[i].end(), [](float v) { return std::isfinite(v); }));
    EXPECT_TRUE(test::nmse_within(tensor[i], test::widen(scalar[i]), tol::kAttentionGradNmse(DType::f16), names[i]));
  }
}

// What ptxas built the tensor-core kernels with, read back from the device: no
// local memory (spills) in any of the 18 (forward, dQ, dK/dV x f16, bf16 x head
// dims 32, 64, 128); the shared memory per SM the design assumed for the code's
// architecture is the device's; and at least the blocks per SM each was built for
// (its __launch_bounds__ minimum) fit at once; and the code comes from compute_80
// or newer (the dispatch's own check).
TEST(AttentionTensorCoreCuda, KernelsHaveNoSpillsAndTheirDesignedOccupancy) {
  HR_TENSOR_CORE_DEVICE(dev, DType::bf16);
#if HEADROOM_HAVE_CUDA
  const int ordinal = dev.record().ordinal;
  for (DType dt : {DType::f16, DType::bf16})
    for (int64_t D : {32, 64, 128})
      for (const ops::cuda::TcKernelResources& r : ops::cuda::tensor_core_kernel_resources(ordinal, dt, D)) {
        const std::string what = fmt::format("{} {} D{}", r.kernel, dtype_name(dt), D);
        RecordProperty(what, fmt::format("sm_{} from compute_{}: {} registers, {} B local, {} B shared, {} blocks/SM "
                                         "(designed {})",
                                         r.binary_cc, r.code_cc, r.registers, r.local_bytes, r.smem_bytes,
                                         r.blocks_per_sm, r.design_blocks));
        // The device took the tensor-core kernels, so their code has real bodies.
        EXPECT_GE(r.code_cc, 80) << what;
        EXPECT_EQ(r.local_bytes, 0u) << what << ": " << r.registers << " registers and local memory (spills)";
        EXPECT_EQ(r.sm_smem_bytes, r.design_sm_smem_bytes) << what << " built for sm_" << r.binary_cc;
        EXPECT_GE(r.blocks_per_sm, 1) << what;
        EXPECT_GE(r.blocks_per_sm, r.design_blocks) << what << " at " << r.registers << " registers";
      }
  EXPECT_THROW(ops::cuda::tensor_core_kernel_resources(ordinal, DType::f32, 64), std::invalid_argument);
  EXPECT_THROW(ops::cuda::tensor_core_kernel_resources(ordinal, DType::bf16, 129), std::invalid_argument);
#endif
}

// ---- cuDNN's fused attention (CUDA, fp16 and bf16), beside the own kernels ----------------

#define HR_CUDNN_DEVICE(dev, dt)                                                                        \
  HR_TEST_DEVICE(dev, BackendKind::cuda);                                                               \
  if (const std::string hr_cudnn_why = why_not(dev, ops::GpuAttentionKernel::cudnn, (dt), 64);          \
      !hr_cudnn_why.empty())                                                                            \
  GTEST_SKIP() << "cuDNN attention unavailable: " << hr_cudnn_why

class AttentionCudnn : public testing::TestWithParam<DType> {};

// The masks cuDNN's graphs take; packing's segment masks take the own kernels.
constexpr MaskKind kCudnnMasks[] = {MaskKind::none, MaskKind::causal, MaskKind::causal_padding};

// How many cuDNN graphs this process has run (0 without the CUDA backend).
uint64_t cudnn_runs() {
#if HEADROOM_HAVE_CUDA
  return ops::cuda::cudnn_attention_executions();
#else
  return 0;
#endif
}

// One forward and backward of the memory-efficient form with `kernel` selected for
// the forward and `backward_kernel` for the backward, under an op fault (none by
// default); the gradients widened, and how many cuDNN graphs ran (each form that
// asks for cuDNN must add one: a fallback to the scalar kernels would compare them
// with themselves).
struct CudnnPass {
  std::vector<float> out, lse;
  std::vector<double> dq, dk, dv;
  uint64_t cudnn_runs = 0;
};
// A read-back's bytes, for bitwise_mismatches.
template <typename T>
std::vector<uint8_t> bytes_of(const std::vector<T>& v) {
  std::vector<uint8_t> b(v.size() * sizeof(T));
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}
// Bytes in which two passes' outputs (forward: out and lse; backward: dq, dk, dv) differ.
size_t forward_mismatches(const CudnnPass& a, const CudnnPass& b) {
  return bitwise_mismatches(bytes_of(a.out), bytes_of(b.out)) + bitwise_mismatches(bytes_of(a.lse), bytes_of(b.lse));
}
size_t backward_mismatches(const CudnnPass& a, const CudnnPass& b) {
  return bitwise_mismatches(bytes_of(a.dq), bytes_of(b.dq)) + bitwise_mismatches(bytes_of(a.dk), bytes_of(b.dk)) +
         bitwise_mismatches(bytes_of(a.dv), bytes_of(b.dv));
}
CudnnPass cudnn_pass(Device& dev, const Qkv& x, const Mask& m, const Tensor& g, Shape shape, DType dt, float scale,
                     ops::GpuAttentionKernel kernel, ops::GpuAttentionKernel backward_kernel,
                     const ops::OpFault& fault = {}) {
  const ops::ScopedOpFault armed(fault);
  const uint64_t before = cudnn_runs();
  Tensor out = Tensor::empty(dev, shape, dt, Consumer::activations);
  Tensor dq = Tensor::empty(dev, shape, dt, Consumer::activations), dk = dq.clone(), dv = dq.clone();
  ops::AttentionSaved saved;
  {
    const ops::ScopedGpuAttentionKernel selected(kernel);
    ops::attention_forward(AttentionImpl::memory_efficient, x.q, x.k, x.v, m.dev, scale, out, saved,
                           Consumer::activations);
  }
  {
    const ops::ScopedGpuAttentionKernel selected(backward_kernel);
    ops::attention_backward(AttentionImpl::memory_efficient, x.q, x.k, x.v, out, g, m.dev, scale, saved, dq, dk, dv);
  }
  return {out.to_host_f32(), saved.lse.to_host_f32(), test::widen(dq.to_host_f32()),
          test::widen(dk.to_host_f32()), test::widen(dv.to_host_f32()), cudnn_runs() - before};
}

// The shapes of the tests below, [2, 2, T, D] at scale 1/sqrt(D): T off the tiles'
// multiples and across several of them, head dims 128 and 64. Each (shape, mask)
// builds one cuDNN graph a direction, which cuDNN may compile at run time: the
// tests share them (12 a dtype) to keep the conformance step's time.
constexpr std::pair<int64_t, int64_t> kCudnnShapes[] = {{129, 128}, {520, 64}};

// The padded case of the tests that share one input: [2, 2, 520, 64] (kCudnnShapes[1])
// under the causal and padding masks, at scale 1/sqrt(D), with q, k, v drawn from
// `seed` and dO from seed + 3.
struct PaddedCase {
  Shape shape;
  float scale;
  Qkv x;
  Mask m;
  Tensor g;
};
PaddedCase padded_case(Device& dev, DType dt, uint64_t seed) {
  const int64_t B = 2, H = 2, T = kCudnnShapes[1].first, D = kCudnnShapes[1].second;
  return {{B, H, T, D}, 1.f / std::sqrt(static_cast<float>(D)), random_qkv(dev, {B, H, T, D}, dt, seed),
          make_mask(dev, MaskKind::causal_padding, B, T),
          Tensor::from_host(dev, test::random_nonzero(static_cast<size_t>(B * H * T * D), seed + 3), {B, H, T, D}, dt,
                            Consumer::activations)};
}

// With a libcudnn.so.9 that loads on a GPU of compute capability 8.0 or newer, the
// small graphs of cudnn_attention_available build with the non-deterministic
// backward: a failure there is a finding, not a skip (the form's other tests skip
// with its reason). The deterministic backward, which runs ask for, must build on
// Hopper (compute capability 9.x: a dP-workspace engine before cuDNN 9.25, ordered
// dQ sums from it); elsewhere the frontend may refuse it (Blackwell before 9.18,
// Ampere), and what it says is recorded.
TEST(AttentionCudnnCuda, BuildsWhereTheLibraryLoads) {
  HR_TEST_DEVICE(dev, BackendKind::cuda);
#if HEADROOM_HAVE_CUDA
  if (ops::cuda::cudnn_attention_library().empty())
    GTEST_SKIP() << "cuDNN attention unavailable: " << why_not(dev, ops::GpuAttentionKernel::cudnn, DType::bf16, 64);
  std::string why;
  {
    const ops::cuda::ScopedCudnnDeterminism non_deterministic(false);
    why = why_not(dev, ops::GpuAttentionKernel::cudnn, DType::bf16, 64);
  }
  if (why.rfind("compute capability", 0) == 0) GTEST_SKIP() << why;  // the reason as the predicate words it
  RecordProperty("cudnn", ops::cuda::cudnn_attention_library());
  EXPECT_EQ(why, "") << ops::cuda::cudnn_attention_library() << " loads but does not run here";
  ASSERT_TRUE(ops::cuda::cudnn_attention_deterministic());
  const std::string why_det = why_not(dev, ops::GpuAttentionKernel::cudnn, DType::bf16, 64);
  RecordProperty("deterministic_backward", why_det.empty() ? std::string("builds") : why_det);
  if (dev.record().cc_major == 9)
    EXPECT_EQ(why_det, "") << ops::cuda::cudnn_attention_library() << "'s deterministic backward does not build on "
                           << dev.record().name;
#endif
}

// OPS-1 for cuDNN's forward: against float64 under each mask it takes. Controls:
// the op's output off by a relative error whose NMSE is 30 times the bound
// (subtle) and by 0.5 (gross) must fail it.
TEST_P(AttentionCudnn, ForwardMatchesFloat64Reference) {
  const DType dt = GetParam();
  HR_CUDNN_DEVICE(dev, dt);
  const double bound = tol::kAttentionNmse(dt);
  double worst = 0;
  uint64_t seed = 11000;
  for (auto [T, D] : kCudnnShapes)
    for (MaskKind mk : kCudnnMasks) {
      const int64_t B = 2, H = 2;
      const float scale = 1.f / std::sqrt(static_cast<float>(D));
      const Qkv x = random_qkv(dev, {B, H, T, D}, dt, seed += 5);
      const Mask m = make_mask(dev, mk, B, T);
      const auto want = ref::attention_forward(x.qh, x.kh, x.vh, {B, H, T, D}, m.causal, m.kv_len, m.seg, scale);
      const std::string what = fmt::format("cuDNN T {} D {} mask {}", T, D, mask_name(mk));
      for (double rel : {0.0, std::sqrt(30 * bound), 0.5}) {
        ops::OpFault f;
        if (rel > 0) {
          f.op = "attention_forward";
          f.output_rel_error = rel;
        }
        const ops::ScopedOpFault armed(f);
        const ops::ScopedGpuAttentionKernel selected(ops::GpuAttentionKernel::cudnn);
        Tensor out = Tensor::empty(dev, {B, H, T, D}, dt, Consumer::activations);
        ops::AttentionSaved saved;
        const uint64_t before = cudnn_runs();
        ops::attention_forward(AttentionImpl::memory_efficient, x.q, x.k, x.v, m.dev, scale, out, saved,
                               Consumer::activations);
        ASSERT_EQ(cudnn_runs() - before, 1u) << what << ": cuDNN did not run";
        if (rel == 0) {
          EXPECT_TRUE(test::nmse_within(out.to_host_f32(), want, bound, what));
          worst = std::max(worst, test::nmse(out.to_host_f32(), want));
        } else {
          EXPECT_FALSE(test::nmse_within(out.to_host_f32(), want, bound, what))
              << what << ": the output off by " << rel << " passed";
        }
      }
    }
  RecordProperty("worst_nmse", fmt::format("{:.3g}", worst));
}

// cuDNN's backward against the scalar kernels' (each after its own forward). Controls: the saved log-sum-exp
// off by d (ops::OpFault::lse_offset, in cuDNN's run only), which scales every
// recomputed probability by e^-d, with (1 - e^-d)^2 30 times the bound (subtle)
// and d = 1 (gross): cuDNN must read the statistics it is handed.
TEST_P(AttentionCudnn, BackwardAgreesWithScalarKernels) {
  const DType dt = GetParam();
  HR_CUDNN_DEVICE(dev, dt);
  const double bound = tol::kAttentionGradNmse(dt);
  using K = ops::GpuAttentionKernel;
  double worst = 0;
  uint64_t seed = 11500;
  for (auto [T, D] : kCudnnShapes)
    for (MaskKind mk : kCudnnMasks) {
      const int64_t B = 2, H = 2;
      const float scale = 1.f / std::sqrt(static_cast<float>(D));
      const Qkv x = random_qkv(dev, {B, H, T, D}, dt, seed += 5);
      const Mask m = make_mask(dev, mk, B, T);
      Tensor g = Tensor::from_host(dev, test::random_nonzero(static_cast<size_t>(B * H * T * D), seed + 3),
                                   {B, H, T, D}, dt, Consumer::activations);
      const CudnnPass scalar = cudnn_pass(dev, x, m, g, {B, H, T, D}, dt, scale, K::scalar, K::scalar);
      ASSERT_EQ(scalar.cudnn_runs, 0u);
      for (double d : {0.0, -std::log1p(-std::sqrt(30 * bound)), 1.0}) {
        ops::OpFault f;
        if (d > 0) {
          f.op = "attention_forward";
          f.lse_offset = d;
        }
        const CudnnPass cudnn = cudnn_pass(dev, x, m, g, {B, H, T, D}, dt, scale, K::cudnn, K::cudnn, f);
        const std::string what = fmt::format("T {} D {} mask {} lse offset {:.3g}", T, D, mask_name(mk), d);
        ASSERT_EQ(cudnn.cudnn_runs, 2u) << what << ": cuDNN did not run both directions";
        const std::pair<const char*, std::pair<const std::vector<double>*, const std::vector<double>*>> grads[] = {
            {"dq", {&cudnn.dq, &scalar.dq}}, {"dk", {&cudnn.dk, &scalar.dk}}, {"dv", {&cudnn.dv, &scalar.dv}}};
        for (const auto& [name, pair] : grads) {
          const std::vector<float> got(pair.first->begin(), pair.first->end());
          if (d == 0) {
            EXPECT_TRUE(test::nmse_within(got, *pair.second, bound, std::string(name) + " " + what));
            worst = std::max(worst, test::nmse(got, *pair.second));
          } else if (std::string(name) == "dv") {  // dV = P^T dO: every entry scaled by e^-d
            EXPECT_FALSE(test::nmse_within(got, *pair.second, bound, std::string(name) + " " + what))
                << what << ": cuDNN's backward did not follow the statistics it was handed";
          }
        }
      }
    }
  RecordProperty("worst_grad_nmse_vs_scalar", fmt::format("{:.3g}", worst));
}

// The two forms save the same statistics (the natural-log row log-sum-exp), so
// cuDNN's backward after the scalar kernels' forward, and the scalar backward after
// cuDNN's forward, give the scalar kernels' gradients. Controls: the forward's saved
// statistics off by d (subtle, (1 - e^-d)^2 30 times the bound, and gross, d = 1)
// must show in the other form's dV.
TEST_P(AttentionCudnn, EitherBackwardFollowsEitherForward) {
  const DType dt = GetParam();
  HR_CUDNN_DEVICE(dev, dt);
  using K = ops::GpuAttentionKernel;
  const PaddedCase c = padded_case(dev, dt, 12000);
  const CudnnPass scalar = cudnn_pass(dev, c.x, c.m, c.g, c.shape, dt, c.scale, K::scalar, K::scalar);
  const double bound = tol::kAttentionGradNmse(dt);
  for (auto [fwd, bwd] : {std::pair<K, K>{K::scalar, K::cudnn}, {K::cudnn, K::scalar}}) {
    const std::string what =
        fmt::format("forward {}, backward {}", ops::gpu_attention_kernel_name(fwd), ops::gpu_attention_kernel_name(bwd));
    const CudnnPass mixed = cudnn_pass(dev, c.x, c.m, c.g, c.shape, dt, c.scale, fwd, bwd);
    ASSERT_EQ(mixed.cudnn_runs, 1u) << what;
    for (auto [got, want] : {std::pair{&mixed.dq, &scalar.dq}, {&mixed.dk, &scalar.dk}, {&mixed.dv, &scalar.dv}})
      EXPECT_TRUE(test::nmse_within(std::vector<float>(got->begin(), got->end()), *want, bound, what));
    for (double d : {-std::log1p(-std::sqrt(30 * bound)), 1.0}) {
      ops::OpFault f;
      f.op = "attention_forward";
      f.lse_offset = d;
      const CudnnPass off = cudnn_pass(dev, c.x, c.m, c.g, c.shape, dt, c.scale, fwd, bwd, f);
      EXPECT_FALSE(test::nmse_within(std::vector<float>(off.dv.begin(), off.dv.end()), scalar.dv, bound, what))
          << what << ": the forward's statistics off by " << d << " did not reach the backward";
    }
  }
}

// cuDNN's backward repeats bit for bit, as the own kernels' does (the runs ask for
// its deterministic algorithm; the properties that compare gradients bitwise need
// it), and so does its forward; each backward ran a graph built with the
// deterministic algorithm asked for, and one with the setting off does not count as
// such (a non-deterministic backward may well repeat at this size, so the count,
// not the repeat, shows the flag). Controls: a second pass whose forward statistics
// are off by d = 1e-3 (subtle: every probability 0.1% low, about one 16-bit
// rounding step) and by d = 1 (gross) must differ, so the comparison sees a change
// of that size.
TEST_P(AttentionCudnn, BackwardIsBitwiseRepeatable) {
  const DType dt = GetParam();
  HR_CUDNN_DEVICE(dev, dt);
#if HEADROOM_HAVE_CUDA
  ASSERT_TRUE(ops::cuda::cudnn_attention_deterministic()) << "the runs' setting is the deterministic backward";
#endif
  using K = ops::GpuAttentionKernel;
  const PaddedCase c = padded_case(dev, dt, 12200);
#if HEADROOM_HAVE_CUDA
  const uint64_t det0 = ops::cuda::cudnn_attention_deterministic_backwards();
#endif
  const CudnnPass first = cudnn_pass(dev, c.x, c.m, c.g, c.shape, dt, c.scale, K::cudnn, K::cudnn);
  ASSERT_EQ(first.cudnn_runs, 2u);
#if HEADROOM_HAVE_CUDA
  EXPECT_EQ(ops::cuda::cudnn_attention_deterministic_backwards() - det0, 1u) << "the backward was not deterministic";
  {
    const ops::cuda::ScopedCudnnDeterminism off(false);
    const uint64_t det1 = ops::cuda::cudnn_attention_deterministic_backwards();
    ASSERT_EQ(cudnn_pass(dev, c.x, c.m, c.g, c.shape, dt, c.scale, K::cudnn, K::cudnn).cudnn_runs, 2u);
    EXPECT_EQ(ops::cuda::cudnn_attention_deterministic_backwards(), det1) << "a non-deterministic backward counted";
  }
#endif
  for (double d : {0.0, 1e-3, 1.0}) {
    ops::OpFault f;
    if (d > 0) {
      f.op = "attention_forward";
      f.lse_offset = d;
    }
    const CudnnPass again = cudnn_pass(dev, c.x, c.m, c.g, c.shape, dt, c.scale, K::cudnn, K::cudnn, f);
    ASSERT_EQ(again.cudnn_runs, 2u);
    const size_t diff = backward_mismatches(first, again);
    if (d == 0) {
      EXPECT_EQ(forward_mismatches(first, again), 0u) << "cuDNN's forward did not repeat";
      EXPECT_EQ(diff, 0u) << "cuDNN's backward did not repeat bit for bit";
    } else {
      EXPECT_GT(diff, 0u) << "statistics off by " << d << " gave the same gradients";
    }
  }
}

// The graph cache at a capacity of 2 (one shape's forward and backward): a second
// shape pushes the padded case's graphs out, and the padded case then builds them
// again and repeats its first pass bit for bit (a graph destroyed under a queued
// kernel, or a pass run on another shape's graph, would not). The cache never holds
// more than its capacity. The capacity is put back, pushing nothing out.
TEST_P(AttentionCudnn, GraphsPushedOutOfTheCacheAreBuiltAgain) {
  const DType dt = GetParam();
  HR_CUDNN_DEVICE(dev, dt);
#if HEADROOM_HAVE_CUDA
  using K = ops::GpuAttentionKernel;
  struct ScopedCapacity {
    size_t before = ops::cuda::set_cudnn_attention_graph_capacity(2);
    ~ScopedCapacity() { ops::cuda::set_cudnn_attention_graph_capacity(before); }
  } capacity;
  ASSERT_GE(capacity.before, 64u) << "the default capacity holds a run's shapes";
  const PaddedCase c = padded_case(dev, dt, 12300);
  const CudnnPass first = cudnn_pass(dev, c.x, c.m, c.g, c.shape, dt, c.scale, K::cudnn, K::cudnn);
  ASSERT_EQ(first.cudnn_runs, 2u);
  const ops::cuda::CudnnGraphCache held = ops::cuda::cudnn_attention_graph_cache();
  EXPECT_EQ(held.held, 2u);
  {
    const int64_t B = 2, H = 2, T = kCudnnShapes[0].first, D = kCudnnShapes[0].second;
    const Qkv x = random_qkv(dev, {B, H, T, D}, dt, 12310);
    const Mask m = make_mask(dev, MaskKind::causal, B, T);
    const Tensor g = Tensor::from_host(dev, test::random_nonzero(static_cast<size_t>(B * H * T * D), 12313),
                                       {B, H, T, D}, dt, Consumer::activations);
    ASSERT_EQ(cudnn_pass(dev, x, m, g, {B, H, T, D}, dt, 1.f / std::sqrt(static_cast<float>(D)), K::cudnn, K::cudnn)
                  .cudnn_runs,
              2u);
  }
  const ops::cuda::CudnnGraphCache other = ops::cuda::cudnn_attention_graph_cache();
  EXPECT_EQ(other.built - held.built, 2u) << "the second shape's graphs were not built";
  EXPECT_EQ(other.pushed_out - held.pushed_out, 2u) << "the padded case's graphs were not pushed out";
  EXPECT_EQ(other.held, 2u);
  const CudnnPass again = cudnn_pass(dev, c.x, c.m, c.g, c.shape, dt, c.scale, K::cudnn, K::cudnn);
  ASSERT_EQ(again.cudnn_runs, 2u);
  const ops::cuda::CudnnGraphCache rebuilt = ops::cuda::cudnn_attention_graph_cache();
  EXPECT_EQ(rebuilt.built - other.built, 2u) << "the padded case ran without building its graphs again";
  EXPECT_EQ(rebuilt.held, 2u);
  EXPECT_EQ(forward_mismatches(first, again), 0u) << "the rebuilt forward did not repeat";
  EXPECT_EQ(backward_mismatches(first, again), 0u) << "the rebuilt backward did not repeat";
#endif
}

// Key lengths outside [1, T], as the own kernels take them: batch row 0 has no key
// (length 0) and gives zeros, an lse of -inf and zero gradients; batch row 1's
// length is past T (T + 9) and it sees every key, against float64. The gradients
// agree with the scalar kernels'. [2, 2, 520, 64] causal + padding (the graphs of
// padded_case); cuDNN runs both directions. Controls: the rows without a key
// written as 1e-3 (subtle) and 1 (gross) by the forward, then by the backward
// (OpFault::keyless_fill), must fail the zero checks; the output off by a relative
// error whose NMSE is 30 times the bound (subtle) and by 0.5 (gross) must fail row
// 1's comparison.
TEST_P(AttentionCudnn, KeyLengthsOutsideOneToTAsTheOwnKernels) {
  const DType dt = GetParam();
  HR_CUDNN_DEVICE(dev, dt);
  using K = ops::GpuAttentionKernel;
  PaddedCase c = padded_case(dev, dt, 12700);
  const int64_t B = c.shape[0], T = c.shape[2];
  c.m.kv_len = {0, static_cast<int32_t>(T + 9)};
  c.m.dev.key_valid_len = Tensor::from_host_i32(dev, c.m.kv_len, {B}, Consumer::activations);
  const auto want = ref::attention_forward(c.x.qh, c.x.kh, c.x.vh, {c.shape[0], c.shape[1], T, c.shape[3]}, true,
                                           c.m.kv_len, {}, c.scale);
  const std::vector<double> want_row1(want.begin() + static_cast<std::ptrdiff_t>(want.size() / 2), want.end());
  auto row1 = [](const std::vector<float>& v) {
    return std::vector<float>(v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
  };
  // Entries of batch row 0 that are not `value`.
  auto row0_not = [](const auto& v, double value) {
    size_t n = 0;
    for (size_t i = 0; i < v.size() / 2; ++i) n += static_cast<double>(v[i]) == value ? 0 : 1;
    return n;
  };
  const double bound = tol::kAttentionNmse(dt), grad_bound = tol::kAttentionGradNmse(dt);
  const CudnnPass scalar = cudnn_pass(dev, c.x, c.m, c.g, c.shape, dt, c.scale, K::scalar, K::scalar);
  const CudnnPass clean = cudnn_pass(dev, c.x, c.m, c.g, c.shape, dt, c.scale, K::cudnn, K::cudnn);
  ASSERT_EQ(clean.cudnn_runs, 2u) << "cuDNN did not run both directions";
  for (const CudnnPass* p : {&scalar, &clean}) {
    const char* who = p == &scalar ? "scalar kernels" : "cuDNN";
    EXPECT_EQ(row0_not(p->out, 0.0), 0u) << who << ": outputs of the row without keys";
    EXPECT_EQ(row0_not(p->lse, -INFINITY), 0u) << who << ": lse of the row without keys";
    for (const std::vector<double>* grad : {&p->dq, &p->dk, &p->dv})
      EXPECT_EQ(row0_not(*grad, 0.0), 0u) << who << ": gradients of the row without keys";
  }
  EXPECT_TRUE(test::nmse_within(row1(clean.out), want_row1, bound, "cuDNN, key length T + 9"));
  for (auto [got, ref] : {std::pair{&clean.dq, &scalar.dq}, {&clean.dk, &scalar.dk}, {&clean.dv, &scalar.dv}})
    EXPECT_TRUE(test::nmse_within(std::vector<float>(got->begin(), got->end()), *ref, grad_bound, "cuDNN gradients"));
  for (const char* op : {"attention_forward", "attention_backward"})
    for (double fill : {1e-3, 1.0}) {
      ops::OpFault f;
      f.op = op;
      f.keyless_fill = fill;
      const CudnnPass off = cudnn_pass(dev, c.x, c.m, c.g, c.shape, dt, c.scale, K::cudnn, K::cudnn, f);
      const size_t seen = std::string(op) == "attention_forward" ? row0_not(off.out, 0.0) : row0_not(off.dq, 0.0);
      EXPECT_GT(seen, 0u) << op << " writing " << fill << " into the row without keys passed";
    }
  for (double rel : {std::sqrt(30 * bound), 0.5}) {
    ops::OpFault f;
    f.op = "attention_forward";
    f.output_rel_error = rel;
    const CudnnPass off = cudnn_pass(dev, c.x, c.m, c.g, c.shape, dt, c.scale, K::cudnn, K::cudnn, f);
    EXPECT_FALSE(test::nmse_within(row1(off.out), want_row1, bound, "cuDNN, key length T + 9, output off"))
        << "the output off by " << rel << " passed";
  }
}

// A packed batch's segment mask is not one of cuDNN's: the predicate says so, and
// with cuDNN selected the scalar kernels run, bit for bit.
TEST_P(AttentionCudnn, SegmentMasksTakeTheScalarKernels) {
  const DType dt = GetParam();
  HR_CUDNN_DEVICE(dev, dt);
  using K = ops::GpuAttentionKernel;
  const int64_t B = 2, H = 2, T = 77, D = 64;
  const Qkv x = random_qkv(dev, {B, H, T, D}, dt, 12500);
  const Mask m = make_mask(dev, MaskKind::causal_packed, B, T);
#if HEADROOM_HAVE_CUDA
  std::string why;
  EXPECT_FALSE(ops::cuda::cudnn_attention_available(x.q, m.dev, &why));
  EXPECT_NE(why.find("segment"), std::string::npos) << why;
#endif
  Tensor g = Tensor::from_host(dev, test::random_nonzero(static_cast<size_t>(B * H * T * D), 12503), {B, H, T, D},
                               dt, Consumer::activations);
  const KernelFallbacks fell0 = kernel_fallbacks();
  const CudnnPass scalar = cudnn_pass(dev, x, m, g, {B, H, T, D}, dt, 0.125f, K::scalar, K::scalar);
  EXPECT_TRUE(kernel_fallbacks_between(fell0, kernel_fallbacks()).empty()) << "the scalar kernels, asked for, fell back";
  const KernelFallbacks fell1 = kernel_fallbacks();
  const CudnnPass asked = cudnn_pass(dev, x, m, g, {B, H, T, D}, dt, 0.125f, K::cudnn, K::cudnn);
  EXPECT_EQ(asked.cudnn_runs, 0u) << "cuDNN ran under a segment mask";
  // Each direction's fallback is counted with why (what a timed point records).
  const auto fell = kernel_fallbacks_between(fell1, kernel_fallbacks());
  for (const char* op : {"attention_forward:cudnn", "attention_backward:cudnn"}) {
    ASSERT_EQ(fell.count(op), 1u) << op << " fell back uncounted";
    EXPECT_NE(fell.at(op).find("segment"), std::string::npos) << fell.at(op);
  }
  EXPECT_EQ(asked.out, scalar.out);
  EXPECT_EQ(asked.dq, scalar.dq);
  EXPECT_EQ(asked.dv, scalar.dv);
}

// fp32 has the scalar kernels alone, which the GPU setting (a choice among fp16's
// and bf16's forms) does not choose for it: under the tensor-core and the cuDNN
// setting an fp32 forward and backward each run them once and count no fallback.
// The count's control: a bf16 pass under cuDNN with a packed batch's segment mask,
// which cuDNN does not take, counts one fallback in each direction, as an fp32 pass
// once did.
TEST(GpuAttentionKernelCuda, Fp32TakesTheScalarKernelsWithoutAFallback) {
  HR_TEST_DEVICE(dev, BackendKind::cuda);
  using K = ops::GpuAttentionKernel;
  const int64_t B = 2, H = 2, T = 45, D = 64;
  const Shape shape{B, H, T, D};
  auto gradient = [&](DType dt, uint64_t seed) {
    return Tensor::from_host(dev, test::random_nonzero(static_cast<size_t>(B * H * T * D), seed), shape, dt,
                             Consumer::activations);
  };
  // The fallbacks of kernel `asked` between two snapshots, whatever their reasons.
  auto fallbacks_of = [](const KernelFallbacks& before, const KernelFallbacks& after, const std::string& asked) {
    uint64_t n = 0;
    if (const auto a = after.find(asked); a != after.end())
      for (const auto& [why, count] : a->second) {
        n += count;
        if (const auto b = before.find(asked); b != before.end())
          if (const auto w = b->second.find(why); w != b->second.end()) n -= w->second;
      }
    return n;
  };
  auto listed = [](const std::map<std::string, std::string>& fell) {
    std::string out;
    for (const auto& [asked, why] : fell) out += fmt::format(" {} ({})", asked, why);
    return out;
  };
  const Qkv x = random_qkv(dev, shape, DType::f32, 12600);
  const Mask m = make_mask(dev, MaskKind::causal_padding, B, T);
  const Tensor g = gradient(DType::f32, 12603);
  for (const K kernel : {K::tensor_core, K::cudnn}) {
    const KernelCalls calls0 = kernel_calls();
    const KernelFallbacks fell0 = kernel_fallbacks();
    cudnn_pass(dev, x, m, g, shape, DType::f32, 0.125f, kernel, kernel);
    const auto fell = kernel_fallbacks_between(fell0, kernel_fallbacks());
    EXPECT_TRUE(fell.empty()) << ops::gpu_attention_kernel_name(kernel) << ": fp32 counted" << listed(fell);
    const auto ran = kernel_calls_per_run(calls0, kernel_calls(), 1);
    for (const char* op : {"attention_forward:scalar", "attention_backward:scalar"})
      EXPECT_EQ(ran.count(op) ? ran.at(op) : 0.0, 1.0) << ops::gpu_attention_kernel_name(kernel) << ": " << op;
  }
  const Qkv y = random_qkv(dev, shape, DType::bf16, 12610);
  const Mask packed = make_mask(dev, MaskKind::causal_packed, B, T);
  const KernelFallbacks fell1 = kernel_fallbacks();
  cudnn_pass(dev, y, packed, gradient(DType::bf16, 12613), shape, DType::bf16, 0.125f, K::cudnn, K::cudnn);
  const KernelFallbacks fell2 = kernel_fallbacks();
  for (const char* op : {"attention_forward:cudnn", "attention_backward:cudnn"})
    EXPECT_EQ(fallbacks_of(fell1, fell2, op), 1u) << op << ":" << listed(kernel_fallbacks_between(fell1, fell2));
}

INSTANTIATE_TEST_SUITE_P(Cuda, AttentionCudnn, testing::Values(DType::f16, DType::bf16),
                         [](const testing::TestParamInfo<DType>& info) { return std::string(dtype_name(info.param)); });

// The setting's names, and the environment's value checked (a typo is an error).
TEST(GpuAttentionKernel, NamesAndSettingRoundTrip) {
  const ops::GpuAttentionKernel before = ops::gpu_attention_kernel();
  const bool was_default = ops::gpu_attention_kernel_is_default();
  EXPECT_STREQ(ops::gpu_attention_kernel_name(ops::GpuAttentionKernel::scalar), "scalar");
  EXPECT_STREQ(ops::gpu_attention_kernel_name(ops::GpuAttentionKernel::tensor_core), "tensor_core");
  EXPECT_STREQ(ops::gpu_attention_kernel_name(ops::GpuAttentionKernel::cudnn), "cudnn");
  ops::set_gpu_attention_kernel(ops::GpuAttentionKernel::tensor_core);
  EXPECT_EQ(ops::gpu_attention_kernel(), ops::GpuAttentionKernel::tensor_core);
  ops::set_gpu_attention_kernel(ops::GpuAttentionKernel::scalar);
  EXPECT_EQ(ops::gpu_attention_kernel(), ops::GpuAttentionKernel::scalar);
  EXPECT_FALSE(ops::gpu_attention_kernel_is_default());
  ops::restore_gpu_attention_kernel(before, was_default);
}

// A scope that sets the kernels puts back what was there, whether it was still the
// default included: the default alone falls back to the scalar kernels on a device
// that cannot take the tensor-core ones, a choice made by name is refused there.
TEST(GpuAttentionKernel, AScopeRestoresTheDefaultState) {
  const ops::GpuAttentionKernel before = ops::gpu_attention_kernel();
  const bool was_default = ops::gpu_attention_kernel_is_default();
  ops::restore_gpu_attention_kernel(ops::GpuAttentionKernel::tensor_core, true);
  {
    const ops::ScopedGpuAttentionKernel scoped(ops::GpuAttentionKernel::scalar);
    EXPECT_EQ(ops::gpu_attention_kernel(), ops::GpuAttentionKernel::scalar);
    EXPECT_FALSE(ops::gpu_attention_kernel_is_default());
  }
  EXPECT_EQ(ops::gpu_attention_kernel(), ops::GpuAttentionKernel::tensor_core);
  EXPECT_TRUE(ops::gpu_attention_kernel_is_default());
  ops::restore_gpu_attention_kernel(before, was_default);
}

// ---- the exponent fit itself -------------------------------------------------------------

TEST(PowerLawFit, RecoversExponentAndPrefactor) {
  const std::vector<double> x = {2, 4, 8, 16, 32};
  std::vector<double> y;
  for (double v : x) y.push_back(3.0 * std::pow(v, 1.5));
  const PowerFit f = fit_power_law(x, y);
  EXPECT_NEAR(f.exponent, 1.5, 1e-12);
  EXPECT_NEAR(f.prefactor, 3.0, 1e-10);
  EXPECT_NEAR(f.r2, 1.0, 1e-12);
  // y = T^2 + 64 T (naive attention's shape): the exponent lies between 1 and 2.
  std::vector<double> y2;
  for (double v : x) y2.push_back(v * v + 64 * v);
  const PowerFit f2 = fit_power_law(x, y2);
  EXPECT_GT(f2.exponent, 1.0);
  EXPECT_LT(f2.exponent, 1.5);
  EXPECT_THROW(fit_power_law({1, 2}, {1, 0}), Error);
  EXPECT_THROW(fit_power_law({2, 2}, {1, 3}), Error);
  EXPECT_THROW(fit_power_law({2}, {1}), Error);
}

}  // namespace
}  // namespace hr
