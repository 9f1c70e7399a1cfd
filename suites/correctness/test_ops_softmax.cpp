// Masked row softmax conformance: forward / backward against the float64
// reference (OPS-1) with causal, padding and packed-segment masks, backward against
// finite differences (OPS-2), mask semantics held exactly (a probability across a
// segment boundary or past key_valid_len is exactly 0; a fully masked row is zeros,
// not NaN), a negative control without the boundary mask, DET-1, and on the CPU a
// row's prefix of allowed keys against the same keys given by segments, bitwise.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "harness/check.hpp"
#include "kernels/common/op_fault.hpp"
#include "kernels/softmax/softmax.hpp"
#include "kernels/softmax/softmax_math.hpp"
#include "kernels/softmax/softmax_ref.hpp"
#include "suites/common/finite_diff.hpp"
#include "suites/common/op_check.hpp"
#include "suites/common/test_support.hpp"
#include "harness/tolerances.hpp"

namespace {

using hr::Consumer;
using hr::DType;
using hr::Tensor;
using hr::ref::SoftmaxShape;
using hr::test::Guarded;
using hr::test::stored_values;
using vecd = std::vector<double>;
using veci = std::vector<int32_t>;

constexpr float kScale = 0.7f;

class SoftmaxOp : public testing::TestWithParam<hr::test::BackendDType> {};

// Segment ids of packed rows: runs of lengths 1..T/3 with increasing ids, then
// (for the padding tail) the last id repeated.
veci packed_segments(int64_t B, int64_t T, uint64_t seed) {
  std::mt19937_64 rng(seed);
  veci seg(static_cast<size_t>(B * T));
  for (int64_t b = 0; b < B; ++b) {
    int32_t id = 0;
    int64_t left = 0;
    for (int64_t t = 0; t < T; ++t) {
      if (left == 0) {
        ++id;
        left = 1 + static_cast<int64_t>(rng() % static_cast<uint64_t>(std::max<int64_t>(1, T / 3)));
      }
      seg[static_cast<size_t>(b * T + t)] = id;
      --left;
    }
  }
  return seg;
}

struct MaskCase {
  std::string name;
  SoftmaxShape sh;
  bool causal;
  veci kvl, seg;
};

std::vector<MaskCase> mask_cases() {
  std::vector<MaskCase> v;
  for (int64_t S : {1, 15, 16, 17, 127, 128, 129, 4097})
    v.push_back({"nomask S=" + std::to_string(S), {2, 2, 3, S}, false, {}, {}});
  for (int64_t S : {1, 15, 16, 17, 127, 128, 129})
    v.push_back({"causal S=" + std::to_string(S), {1, 2, S, S}, true, {}, {}});
  // Padding with a fully padded batch row (key_valid_len 0): its rows are all masked.
  v.push_back({"padding S=129", {3, 2, 4, 129}, false, {100, 0, 129}, {}});
  v.push_back({"causal+padding+packed S=129", {2, 2, 129, 129}, true, {129, 90}, packed_segments(2, 129, 3)});
  v.push_back({"packed S=17", {2, 1, 17, 17}, false, {}, packed_segments(2, 17, 4)});
  return v;
}

struct Masked {
  hr::ops::AttnMask mask;
  Masked(hr::Device& dev, const MaskCase& c) {
    mask.causal = c.causal;
    if (!c.kvl.empty()) mask.key_valid_len = Tensor::from_host_i32(dev, c.kvl, {c.sh.B}, Consumer::workspace);
    if (!c.seg.empty()) mask.segment_ids = Tensor::from_host_i32(dev, c.seg, {c.sh.B, c.sh.T}, Consumer::workspace);
  }
};

int64_t numel(const SoftmaxShape& s) { return s.B * s.H * s.T * s.S; }

// The CPU's whole-row loops take a row's keys as the prefix allowed_end gives when
// there are no segments: it must be exactly the keys `allowed` takes.
TEST(SoftmaxMask, AllowedEndIsThePrefixAllowedTakes) {
  for (const bool causal : {false, true})
    for (const int32_t kv_len : {0, 1, 5, 16, 17, 40, INT32_MAX})
      for (int32_t t = 0; t < 16; ++t) {
        const hr::ops::sm::RowMask m{causal, t, kv_len, nullptr};
        const int32_t end = hr::ops::sm::allowed_end(m, 16);
        for (int32_t s = 0; s < 16; ++s) EXPECT_EQ(s < end, hr::ops::sm::allowed(m, s)) << causal << kv_len << t << s;
      }
}

TEST_P(SoftmaxOp, ForwardAndBackwardMatchFloat64Reference) {
  HR_TEST_DEVICE(dev, GetParam().backend);
  const DType dt = GetParam().dtype;
  const double bound = hr::tol::kRowwiseNmse(dt);
  uint64_t seed = 1;
  for (const MaskCase& c : mask_cases()) {
    const int64_t n = numel(c.sh);
    const std::vector<float> x = hr::test::random_nonzero(static_cast<size_t>(n), ++seed, -3.f, 3.f);
    const std::vector<float> dp = hr::test::random_nonzero(static_cast<size_t>(n), ++seed);
    const Masked m(dev, c);
    const hr::Shape shape{c.sh.B, c.sh.H, c.sh.T, c.sh.S};
    Tensor scores = Tensor::from_host(dev, x, shape, dt, Consumer::activations);
    Guarded probs(dev, shape, dt);
    hr::ops::softmax_forward(scores, m.mask, kScale, probs.tensor());
    vecd rp;
    hr::ref::softmax_forward(stored_values(x, dt), c.sh, c.causal, c.kvl, c.seg, kScale, rp);
    const std::vector<float> p = probs.values();
    EXPECT_TRUE(hr::test::nmse_within(p, rp, bound, "softmax p " + c.name));

    Tensor dprobs = Tensor::from_host(dev, dp, shape, dt, Consumer::activations);
    Guarded ds(dev, shape, dt);
    hr::ops::softmax_backward(probs.tensor(), dprobs, kScale, ds.tensor());
    vecd rds;  // the reference backward from the probabilities the op stored
    hr::ref::softmax_backward(hr::test::widen(p), stored_values(dp, dt), c.sh, kScale, rds);
    EXPECT_TRUE(hr::test::nmse_within(ds.values(), rds, bound, "softmax ds " + c.name));
    EXPECT_TRUE(probs.guards_intact()) << c.name;
    EXPECT_TRUE(ds.guards_intact()) << c.name;
  }
}

TEST_P(SoftmaxOp, BackwardMatchesFiniteDifferences) {
  HR_TEST_DEVICE(dev, GetParam().backend);
  const DType dt = GetParam().dtype;
  const MaskCase c{"causal+padding+packed", {2, 1, 17, 17}, true, {17, 11}, packed_segments(2, 17, 9)};
  const int64_t n = numel(c.sh);
  const vecd xs = stored_values(hr::test::random_nonzero(static_cast<size_t>(n), 21, -3.f, 3.f), dt);
  const std::vector<float> w = hr::test::random_nonzero(static_cast<size_t>(n), 22);
  const vecd ws = stored_values(w, dt);
  const vecd fd = hr::test::finite_diff_grad(
      [&](const vecd& x) {
        vecd p;
        hr::ref::softmax_forward(x, c.sh, c.causal, c.kvl, c.seg, kScale, p);
        return hr::test::dot(ws, p);
      },
      xs);
  const Masked m(dev, c);
  const hr::Shape shape{c.sh.B, c.sh.H, c.sh.T, c.sh.S};
  Tensor scores = Tensor::from_host(dev, std::vector<float>(xs.begin(), xs.end()), shape, dt, Consumer::activations);
  Tensor probs = Tensor::empty(dev, shape, dt, Consumer::activations);
  Tensor dprobs = Tensor::from_host(dev, w, shape, dt, Consumer::activations);
  Tensor ds = Tensor::empty(dev, shape, dt, Consumer::activations);
  hr::ops::softmax_forward(scores, m.mask, kScale, probs);
  hr::ops::softmax_backward(probs, dprobs, kScale, ds);
  EXPECT_TRUE(hr::test::nmse_within(ds.to_host_f32(), fd, hr::tol::kRowwiseGradNmse(dt), "softmax fd " + c.name));
}

TEST_P(SoftmaxOp, MasksGiveExactZerosAndNoNaN) {
  HR_TEST_DEVICE(dev, GetParam().backend);
  const DType dt = GetParam().dtype;
  const MaskCase c{"packed", {3, 2, 33, 33}, true, {33, 20, 0}, packed_segments(3, 33, 5)};
  const int64_t n = numel(c.sh);
  const hr::Shape shape{c.sh.B, c.sh.H, c.sh.T, c.sh.S};
  Tensor scores = Tensor::from_host(dev, hr::test::random_nonzero(static_cast<size_t>(n), 8, -3.f, 3.f), shape, dt,
                                    Consumer::activations);
  const Masked m(dev, c);
  Tensor probs = Tensor::empty(dev, shape, dt, Consumer::activations);
  hr::ops::softmax_forward(scores, m.mask, kScale, probs);
  const std::vector<float> p = probs.to_host_f32();
  int cross_segment = 0, padded = 0, fully_masked_rows = 0;
  for (int64_t b = 0; b < c.sh.B; ++b)
    for (int64_t h = 0; h < c.sh.H; ++h)
      for (int64_t t = 0; t < c.sh.T; ++t) {
        const size_t o = static_cast<size_t>(((b * c.sh.H + h) * c.sh.T + t) * c.sh.S);
        double sum = 0;
        bool any = false;
        for (int64_t s = 0; s < c.sh.S; ++s) {
          const float v = p[o + static_cast<size_t>(s)];
          ASSERT_FALSE(std::isnan(v)) << "NaN at b=" << b << " t=" << t << " s=" << s;
          const bool ok = hr::ref::softmax_allowed(c.sh, c.causal, c.kvl, c.seg, b, t, s);
          any |= ok;
          sum += v;
          if (ok) continue;
          EXPECT_EQ(v, 0.f) << "masked probability at b=" << b << " t=" << t << " s=" << s;
          if (s >= c.kvl[static_cast<size_t>(b)]) ++padded;
          else if (c.seg[static_cast<size_t>(b * c.sh.T + s)] != c.seg[static_cast<size_t>(b * c.sh.T + t)])
            ++cross_segment;
        }
        if (any) {
          EXPECT_NEAR(sum, 1.0, 1e-2) << "row b=" << b << " t=" << t;
        } else {
          ++fully_masked_rows;
          EXPECT_EQ(sum, 0.0);
        }
      }
  // The case exercises every kind of mask.
  EXPECT_GT(cross_segment, 0);
  EXPECT_GT(padded, 0);
  // Batch row 2 (key_valid_len 0) is fully masked; so are rows of batch row 1 whose
  // segment starts past its key_valid_len of 20.
  EXPECT_GT(fully_masked_rows, c.sh.H * c.sh.T);

  // Negative control: the same packed rows without the boundary mask leak
  // probability across segments, and the exact-zero check above would catch it.
  hr::ops::AttnMask no_boundary = m.mask;
  no_boundary.segment_ids = Tensor();
  hr::ops::softmax_forward(scores, no_boundary, kScale, probs);
  const std::vector<float> leak = probs.to_host_f32();
  int leaked = 0;
  for (int64_t t = 0; t < c.sh.T; ++t)
    for (int64_t s = 0; s <= t; ++s)
      if (c.seg[static_cast<size_t>(s)] != c.seg[static_cast<size_t>(t)])
        leaked += leak[static_cast<size_t>(t * c.sh.S + s)] > 0.f;
  EXPECT_GT(leaked, 0);
}

TEST_P(SoftmaxOp, RepeatsBitwise) {
  HR_TEST_DEVICE(dev, GetParam().backend);
  const DType dt = GetParam().dtype;
  const MaskCase c{"mixed", {2, 2, 129, 129}, true, {129, 77}, packed_segments(2, 129, 6)};
  const hr::Shape shape{c.sh.B, c.sh.H, c.sh.T, c.sh.S};
  const int64_t n = numel(c.sh);
  Tensor scores = Tensor::from_host(dev, hr::test::random_nonzero(static_cast<size_t>(n), 1, -3.f, 3.f), shape, dt,
                                    Consumer::activations);
  Tensor dprobs =
      Tensor::from_host(dev, hr::test::random_nonzero(static_cast<size_t>(n), 2), shape, dt, Consumer::activations);
  const Masked m(dev, c);
  std::vector<uint8_t> out[2][2];
  for (auto& run : out) {
    Tensor probs = Tensor::empty(dev, shape, dt, Consumer::activations);
    Tensor ds = Tensor::empty(dev, shape, dt, Consumer::activations);
    hr::ops::softmax_forward(scores, m.mask, kScale, probs);
    hr::ops::softmax_backward(probs, dprobs, kScale, ds);
    run[0] = probs.to_host_bytes();
    run[1] = ds.to_host_bytes();
  }
  EXPECT_EQ(out[0][0], out[1][0]);
  EXPECT_EQ(out[0][1], out[1][1]);
}

// The CPU's forward takes a row without segments as the prefix of its allowed keys
// and runs its exponentials only up to the vector that holds the last of them; with
// segments it runs them over the whole row. One segment per batch row allows the
// same keys, so both must give the same bytes: a key past the prefix left non-zero,
// or a vector of the prefix left out, shows here. Its controls go through
// softmax_forward's own fault switch: every other call's output one ulp up in its
// first element (subtle) or in every element (gross), DET-1's faults.
TEST(SoftmaxCpu, APrefixRowGivesTheBitsOfTheSameKeysBySegments) {
  hr::Device& dev = hr::test::cpu_device();
  // The cases (dtype, S) whose two forms differ in any byte.
  auto differing = [&] {
    std::vector<std::string> cases;
    for (const DType dt : {DType::f32, DType::f16, DType::bf16})
      for (const int64_t S : {1, 7, 9, 24, 33, 129}) {
        const SoftmaxShape sh{3, 2, S, S};
        const hr::Shape shape{sh.B, sh.H, sh.T, sh.S};
        const veci kvl{static_cast<int32_t>(S), 0, static_cast<int32_t>((S + 1) / 2)};
        Tensor scores = Tensor::from_host(dev, hr::test::random_nonzero(static_cast<size_t>(numel(sh)), 7, -3.f, 3.f),
                                          shape, dt, Consumer::activations);
        std::vector<uint8_t> got[2];
        for (int by_segments = 0; by_segments < 2; ++by_segments) {
          hr::ops::AttnMask mask;
          mask.causal = true;
          mask.key_valid_len = Tensor::from_host_i32(dev, kvl, {sh.B}, Consumer::workspace);
          if (by_segments)
            mask.segment_ids = Tensor::from_host_i32(dev, veci(static_cast<size_t>(sh.B * sh.T), 1), {sh.B, sh.T},
                                                     Consumer::workspace);
          Tensor probs = Tensor::empty(dev, shape, dt, Consumer::activations);
          hr::ops::softmax_forward(scores, mask, kScale, probs);
          got[by_segments] = probs.to_host_bytes();
        }
        if (got[0] != got[1]) cases.push_back(fmt::format("{} S={}", hr::dtype_name(dt), S));
      }
    return cases;
  };
  const std::vector<std::string> clean = differing();
  EXPECT_TRUE(clean.empty()) << "the prefix and the segments differ: " << fmt::format("{}", fmt::join(clean, ", "));
  for (const int64_t n : {int64_t{1}, std::numeric_limits<int64_t>::max()}) {
    hr::ops::OpFault f;
    f.op = "softmax_forward";
    f.unstable_elements = n;
    const hr::ops::ScopedOpFault armed(f);
    EXPECT_EQ(differing().size(), 18u) << "a case's second call, " << (n == 1 ? "one element" : "every element")
                                       << " one ulp up, went unseen";
  }
}

TEST_P(SoftmaxOp, RejectsBadMasks) {
  HR_TEST_DEVICE(dev, GetParam().backend);
  const DType dt = GetParam().dtype;
  Tensor scores = Tensor::zeros(dev, {1, 1, 4, 5}, dt, Consumer::activations);
  Tensor probs = Tensor::empty(dev, {1, 1, 4, 5}, dt, Consumer::activations);
  hr::ops::AttnMask causal;  // causal needs T == S
  EXPECT_THROW(hr::ops::softmax_forward(scores, causal, 1.f, probs), hr::Error);
  hr::ops::AttnMask pad;
  pad.causal = false;
  pad.key_valid_len = Tensor::from_host_i32(dev, {1, 2}, {2}, Consumer::workspace);  // [2] for B = 1
  EXPECT_THROW(hr::ops::softmax_forward(scores, pad, 1.f, probs), hr::Error);
}

INSTANTIATE_TEST_SUITE_P(Ops, SoftmaxOp, testing::ValuesIn(hr::test::all_backend_dtypes()), hr::test::param_name);

}  // namespace
