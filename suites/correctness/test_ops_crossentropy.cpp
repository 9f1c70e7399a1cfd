// Fused cross-entropy conformance: per-token and reduced losses and dlogits
// against the float64 reference (OPS-1) for every reduction, up to V = 50304;
// dlogits against finite differences of the reduced loss (OPS-2); ignored tokens
// give 0 loss and exactly 0 gradient; sum_div_count with count = real tokens equals
// mean; a power-of-two loss_scale scales dlogits exactly; DET-1.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "harness/check.hpp"
#include "kernels/crossentropy/crossentropy.hpp"
#include "kernels/crossentropy/crossentropy_ref.hpp"
#include "suites/common/finite_diff.hpp"
#include "suites/common/op_check.hpp"
#include "suites/common/test_support.hpp"
#include "harness/tolerances.hpp"

namespace {

using hr::Consumer;
using hr::DType;
using hr::Tensor;
using hr::ops::CrossEntropyConfig;
using hr::ops::LossReduction;
using hr::test::Guarded;
using hr::test::stored_values;
using vecd = std::vector<double>;
using veci = std::vector<int32_t>;

class CrossEntropyOp : public testing::TestWithParam<hr::test::BackendDType> {};

constexpr int32_t kIgnore = -100;

// Targets in [0, V) with every third token ignored (padding).
veci make_targets(int64_t N, int64_t V, uint64_t seed) {
  std::mt19937_64 rng(seed);
  veci t(static_cast<size_t>(N));
  for (int64_t n = 0; n < N; ++n) t[n] = n % 3 == 1 ? kIgnore : static_cast<int32_t>(rng() % static_cast<uint64_t>(V));
  return t;
}

// Logits in [-4, 4], none zero.
Tensor random_logits(hr::Device& dev, int64_t N, int64_t V, DType dt, uint64_t seed) {
  return Tensor::from_host(dev, hr::test::random_nonzero(static_cast<size_t>(N * V), seed, -4.f, 4.f), {N, V}, dt,
                           Consumer::activations);
}

const char* name(LossReduction r) {
  return r == LossReduction::mean ? "mean" : r == LossReduction::sum ? "sum" : "sum_div_count";
}

CrossEntropyConfig config(LossReduction r) {
  CrossEntropyConfig cfg;
  cfg.ignore_index = kIgnore;
  cfg.reduction = r;
  cfg.count = 7.5;  // an accumulation window's token count (need not be an integer)
  return cfg;
}

TEST_P(CrossEntropyOp, LossesAndGradientsMatchFloat64Reference) {
  HR_TEST_DEVICE(dev, GetParam().backend);
  const DType dt = GetParam().dtype;
  const double bound = hr::tol::kRowwiseNmse(dt);
  for (int64_t V : {1, 15, 16, 17, 127, 128, 129, 4097, 50304}) {
    const int64_t N = V >= 4097 ? 4 : 7;
    const std::vector<float> x = hr::test::random_nonzero(static_cast<size_t>(N * V), 60 + V, -4.f, 4.f);
    const veci t = make_targets(N, V, 61 + V);
    const vecd xs = stored_values(x, dt);
    Tensor logits = Tensor::from_host(dev, x, {N, V}, dt, Consumer::activations);
    Tensor targets = Tensor::from_host_i32(dev, t, {N}, Consumer::workspace);
    for (LossReduction r : {LossReduction::mean, LossReduction::sum, LossReduction::sum_div_count}) {
      const CrossEntropyConfig cfg = config(r);
      const std::string what = std::string(name(r)) + " V=" + std::to_string(V);
      Guarded losses(dev, {N}, DType::f32);
      const double loss = hr::ops::cross_entropy_forward(logits, targets, cfg, losses.tensor());
      vecd rl;
      const double rloss = hr::ref::cross_entropy_forward(xs, t, V, cfg, rl);
      // Losses are computed in fp32 from the stored logits: the fp32 bound applies.
      const double b32 = hr::tol::kRowwiseNmse(DType::f32);
      EXPECT_TRUE(hr::test::nmse_within(losses.values(), rl, b32, "ce losses " + what));
      EXPECT_TRUE(hr::test::nmse_within({static_cast<float>(loss)}, {rloss}, b32, "ce loss " + what));
      for (DType gdt : {dt, DType::f32}) {
        Guarded d(dev, {N, V}, gdt);
        hr::ops::cross_entropy_backward(logits, targets, cfg, d.tensor());
        vecd rd;
        hr::ref::cross_entropy_backward(xs, t, V, cfg, rd);
        EXPECT_TRUE(hr::test::nmse_within(d.values(), rd, hr::tol::kRowwiseNmse(gdt),
                                          "ce dlogits " + what + " " + hr::dtype_name(gdt)));
        EXPECT_TRUE(d.guards_intact()) << what;
      }
      EXPECT_TRUE(losses.guards_intact()) << what;
    }
  }
}

TEST_P(CrossEntropyOp, GradientMatchesFiniteDifferencesForEveryReduction) {
  HR_TEST_DEVICE(dev, GetParam().backend);
  const DType dt = GetParam().dtype;
  const int64_t N = 5, V = 17;
  const std::vector<float> x = hr::test::random_nonzero(static_cast<size_t>(N * V), 3, -4.f, 4.f);
  const veci t = make_targets(N, V, 4);
  const vecd xs = stored_values(x, dt);
  Tensor logits = Tensor::from_host(dev, x, {N, V}, dt, Consumer::activations);
  Tensor targets = Tensor::from_host_i32(dev, t, {N}, Consumer::workspace);
  for (LossReduction r : {LossReduction::mean, LossReduction::sum, LossReduction::sum_div_count}) {
    CrossEntropyConfig cfg = config(r);
    cfg.loss_scale = 4.f;
    const vecd fd = hr::test::finite_diff_grad(
        [&](const vecd& v) {
          vecd l;
          return cfg.loss_scale * hr::ref::cross_entropy_forward(v, t, V, cfg, l);
        },
        xs);
    Tensor d = Tensor::empty(dev, {N, V}, dt, Consumer::activations);
    hr::ops::cross_entropy_backward(logits, targets, cfg, d);
    EXPECT_TRUE(hr::test::nmse_within(d.to_host_f32(), fd, hr::tol::kRowwiseGradNmse(dt),
                                      std::string("ce fd ") + name(r)));
  }
}

TEST_P(CrossEntropyOp, IgnoredTokensReductionsAndLossScale) {
  HR_TEST_DEVICE(dev, GetParam().backend);
  const DType dt = GetParam().dtype;
  const int64_t N = 9, V = 129;
  const veci t = make_targets(N, V, 5);
  Tensor logits = Tensor::from_host(dev, hr::test::random_nonzero(static_cast<size_t>(N * V), 6, -4.f, 4.f), {N, V},
                                    dt, Consumer::activations);
  Tensor targets = Tensor::from_host_i32(dev, t, {N}, Consumer::workspace);
  const int64_t real = hr::ops::count_real_tokens(targets, kIgnore);
  EXPECT_EQ(real, 6);

  // Ignored tokens: loss exactly 0, gradient row exactly 0.
  Tensor losses = Tensor::empty(dev, {N}, DType::f32, Consumer::workspace);
  Tensor d_mean = Tensor::empty(dev, {N, V}, DType::f32, Consumer::activations);
  const double mean = hr::ops::cross_entropy_forward(logits, targets, config(LossReduction::mean), losses);
  hr::ops::cross_entropy_backward(logits, targets, config(LossReduction::mean), d_mean);
  const std::vector<float> l = losses.to_host_f32(), g = d_mean.to_host_f32();
  for (int64_t n = 0; n < N; ++n) {
    if (t[n] != kIgnore) {
      EXPECT_GT(l[n], 0.f);
      continue;
    }
    EXPECT_EQ(l[n], 0.f) << "token " << n;
    for (int64_t v = 0; v < V; ++v) ASSERT_EQ(g[n * V + v], 0.f) << "token " << n << " logit " << v;
  }

  // sum_div_count with count = the real tokens equals mean, bitwise.
  CrossEntropyConfig sdc = config(LossReduction::sum_div_count);
  sdc.count = static_cast<double>(real);
  Tensor d_sdc = Tensor::empty(dev, {N, V}, DType::f32, Consumer::activations);
  Tensor none;
  EXPECT_EQ(hr::ops::cross_entropy_forward(logits, targets, sdc, none), mean);
  hr::ops::cross_entropy_backward(logits, targets, sdc, d_sdc);
  EXPECT_EQ(d_sdc.to_host_bytes(), d_mean.to_host_bytes());

  // A power-of-two loss_scale scales every gradient exactly (fp32 dlogits).
  CrossEntropyConfig scaled = config(LossReduction::mean);
  scaled.loss_scale = 65536.f;
  Tensor d_scaled = Tensor::empty(dev, {N, V}, DType::f32, Consumer::activations);
  hr::ops::cross_entropy_backward(logits, targets, scaled, d_scaled);
  const std::vector<float> gs = d_scaled.to_host_f32();
  for (size_t i = 0; i < g.size(); ++i) ASSERT_EQ(gs[i], 65536.f * g[i]) << "element " << i;
  // The loss itself is not scaled.
  EXPECT_EQ(hr::ops::cross_entropy_forward(logits, targets, scaled, none), mean);

  // A mean over no real token is 0 with zero gradients (not NaN).
  Tensor all_ignored = Tensor::from_host_i32(dev, veci(static_cast<size_t>(N), kIgnore), {N}, Consumer::workspace);
  EXPECT_EQ(hr::ops::cross_entropy_forward(logits, all_ignored, config(LossReduction::mean), none), 0.0);
  hr::ops::cross_entropy_backward(logits, all_ignored, config(LossReduction::mean), d_mean);
  for (float v : d_mean.to_host_f32()) ASSERT_EQ(v, 0.f);
}

TEST_P(CrossEntropyOp, RepeatsBitwise) {
  HR_TEST_DEVICE(dev, GetParam().backend);
  const DType dt = GetParam().dtype;
  const int64_t N = 6, V = 4097;
  Tensor logits = random_logits(dev, N, V, dt, 7);
  Tensor targets = Tensor::from_host_i32(dev, make_targets(N, V, 8), {N}, Consumer::workspace);
  const CrossEntropyConfig cfg = config(LossReduction::mean);
  double loss[2];
  std::vector<uint8_t> grad[2];
  for (int i = 0; i < 2; ++i) {
    Tensor none, d = Tensor::empty(dev, {N, V}, dt, Consumer::activations);
    loss[i] = hr::ops::cross_entropy_forward(logits, targets, cfg, none);
    hr::ops::cross_entropy_backward(logits, targets, cfg, d);
    grad[i] = d.to_host_bytes();
  }
  EXPECT_EQ(loss[0], loss[1]);
  EXPECT_EQ(grad[0], grad[1]);
}

// With the targets' host copy the op reads no targets from the device and gives the
// same loss and gradient bit for bit; the copy's values are what is range-checked,
// and a copy of the wrong size is refused.
TEST_P(CrossEntropyOp, HostCopyOfTargetsGivesTheSameResult) {
  HR_TEST_DEVICE(dev, GetParam().backend);
  const DType dt = GetParam().dtype;
  const int64_t N = 9, V = 300;
  Tensor logits = random_logits(dev, N, V, dt, 21);
  const veci host = make_targets(N, V, 22);
  Tensor targets = Tensor::from_host_i32(dev, host, {N}, Consumer::workspace);
  CrossEntropyConfig cfg = config(LossReduction::sum_div_count);
  Tensor none, d0 = Tensor::empty(dev, {N, V}, dt, Consumer::activations), d1 = d0.clone();
  const double l0 = hr::ops::cross_entropy_forward(logits, targets, cfg, none);
  hr::ops::cross_entropy_backward(logits, targets, cfg, d0);
  cfg.host_targets = &host;
  const double l1 = hr::ops::cross_entropy_forward(logits, targets, cfg, none);
  hr::ops::cross_entropy_backward(logits, targets, cfg, d1);
  EXPECT_EQ(l1, l0);
  EXPECT_EQ(d1.to_host_bytes(), d0.to_host_bytes());
  EXPECT_EQ(hr::ops::count_real_tokens(targets, kIgnore, &host), hr::ops::count_real_tokens(targets, kIgnore));
  veci out_of_range = host;
  out_of_range[4] = static_cast<int32_t>(V);
  cfg.host_targets = &out_of_range;
  EXPECT_THROW(hr::ops::cross_entropy_forward(logits, targets, cfg, none), hr::Error);
  const veci short_copy(host.begin(), host.end() - 1);
  cfg.host_targets = &short_copy;
  EXPECT_THROW(hr::ops::cross_entropy_forward(logits, targets, cfg, none), hr::Error);
}

TEST_P(CrossEntropyOp, RejectsBadTargetsAndCounts) {
  HR_TEST_DEVICE(dev, GetParam().backend);
  const DType dt = GetParam().dtype;
  Tensor logits = Tensor::zeros(dev, {2, 5}, dt, Consumer::activations);
  Tensor none;
  for (veci bad : {veci{0, 5}, veci{-1, 0}}) {
    Tensor t = Tensor::from_host_i32(dev, bad, {2}, Consumer::workspace);
    EXPECT_THROW(hr::ops::cross_entropy_forward(logits, t, config(LossReduction::mean), none), hr::Error);
  }
  Tensor t = Tensor::from_host_i32(dev, {0, 4}, {2}, Consumer::workspace);
  CrossEntropyConfig cfg = config(LossReduction::sum_div_count);
  cfg.count = 0;
  EXPECT_THROW(hr::ops::cross_entropy_forward(logits, t, cfg, none), hr::Error);
}

INSTANTIATE_TEST_SUITE_P(Ops, CrossEntropyOp, testing::ValuesIn(hr::test::all_backend_dtypes()),
                         hr::test::param_name);

}  // namespace
