// MP-1..MP-3 and GA-5 (docs/catalogue.md): fp16 underflow and the loss scale, bf16's
// range, the dynamic loss scaler's state machine and an overflowing micro-batch
// under accumulation, per backend. The tests assert on the property functions
// `headroom run` reports; the controls must be caught by the same checks.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "harness/check.hpp"
#include "harness/data/synthetic.hpp"
#include "harness/properties/accum_support.hpp"
#include "harness/properties/mixed_precision.hpp"
#include "harness/step/train_step.hpp"
#include "harness/tolerances.hpp"
#include "kernels/reduce/reduce.hpp"
#include "suites/common/property_check.hpp"
#include "suites/common/test_support.hpp"

namespace {

using hr::Measurement;

constexpr uint64_t kSeed = 1234;

class MixedPrecision : public testing::TestWithParam<hr::BackendKind> {};

// Three checks (scaled fraction, unscaled fraction, the real fp16 step against
// fp32) and their controls; the unscaled fraction lies near Micikevicius et al.'s.
TEST_P(MixedPrecision, Fp16UnderflowAndLossScale) {
  HR_TEST_DEVICE(dev, GetParam());
  const auto ms = hr::props::mp1_fp16_underflow(dev, hr::Preset::quick, kSeed);
  hr::test::expect_all_passed(ms, 6, 4);
  // The checks judge the real fp16 step: its lost fraction at 2^16 is 0, at a scale
  // held at 1 (the scaler's fault switch) well above the bound.
  EXPECT_EQ(ms.front().metric, "lost_fraction");
  EXPECT_EQ(ms.front().error, 0.0);
  EXPECT_GT(ms[1].error, 10 * ms[1].tolerance);
  const auto& d = ms.front().details;
  const double unscaled = d["flushed_fraction_unscaled"].get<double>();
  EXPECT_GT(unscaled, 0.01);
  EXPECT_LT(unscaled, 0.2);
  EXPECT_EQ(d["flushed_fraction_scaled"].get<double>(), 0.0);
  EXPECT_GE(d["exponent_histogram"].size(), 15u);  // exponents spread over >= 15 octaves
}

TEST_P(MixedPrecision, Bf16KeepsTheSameGradients) {
  HR_TEST_DEVICE(dev, GetParam());
  const auto ms = hr::props::mp2_bf16_range(dev, hr::Preset::quick, kSeed);
  hr::test::expect_all_passed(ms, 6, 4);
  EXPECT_EQ(ms.front().metric, "lost_fraction");
  EXPECT_EQ(ms.front().error, 0.0);
  // The same step with the switch that computes fp16 for bf16 loses values.
  EXPECT_GT(ms[1].error, 10 * ms[1].tolerance);
}

TEST_P(MixedPrecision, LossScalerStateMachine) {
  HR_TEST_DEVICE(dev, GetParam());
  const auto ms = hr::props::mp3_loss_scaler(dev, hr::Preset::quick, kSeed);
  // Four checks; defaults 2 controls, injections 2, trajectory 2, equivalence 2.
  hr::test::expect_all_passed(ms, 12, 8);
  // The defaults are read from a scaler's behaviour, not from its fields.
  const auto& seen = ms.front().details;
  EXPECT_EQ(seen["first_scale"].get<double>(), 65536.0);
  EXPECT_EQ(seen["after_overflow"].get<double>(), 32768.0);
  EXPECT_EQ(seen["after_2000_clean"].get<double>(), 65536.0);
  for (const Measurement& m : ms) {
    if (!m.details.contains("trajectory") || m.negative_control) continue;
    const auto& t = m.details["trajectory"];
    EXPECT_EQ(t["scale"], t["expected_scale"]);
    int skipped = 0;
    for (const auto& s : t["skipped"]) skipped += s.get<bool>() ? 1 : 0;
    EXPECT_EQ(skipped, 2);
  }
}

TEST_P(MixedPrecision, OverflowingMicroBatchSkipsTheWindow) {
  HR_TEST_DEVICE(dev, GetParam());
  const auto ms = hr::props::ga5_overflow_in_window(dev, hr::Preset::quick, kSeed);
  hr::test::expect_all_passed(ms, 11, 6);
  const auto& d = ms.front().details;
  EXPECT_TRUE(d["fp32_gradients_finite_at_that_multiplier"].get<bool>());
  // The window scale is read from each micro-batch's gradients, not from the step.
  ASSERT_EQ(d["window1_scale_seen_per_micro_batch"].size(), 4u);
  ASSERT_EQ(d["window3_scale_seen_per_micro_batch"].size(), 4u);
  for (const auto& r : d["window3_scale_seen_per_micro_batch"]) EXPECT_NEAR(r.get<double>(), 32768.0, 32768.0 * 0.01);
  EXPECT_EQ(d["unscale_passes"].get<int64_t>(), 3);
}

TEST_P(MixedPrecision, MasterWeightsKeepSmallUpdates) {
  HR_TEST_DEVICE(dev, GetParam());
  const auto ms = hr::props::mp4_master_weights(dev, hr::Preset::quick, kSeed);
  hr::test::expect_all_passed(ms, 3, 2);
  EXPECT_GT(ms.front().details["updates_under_quarter_fp16_ulp"].get<int64_t>(), 5000);
  EXPECT_EQ(ms[1].error, 1.0);  // without masters every such update is lost
}

TEST_P(MixedPrecision, SixteenBitActivationsAreHalf) {
  HR_TEST_DEVICE(dev, GetParam());
  const auto ms = hr::props::mp5_activation_bytes(dev, hr::Preset::quick, kSeed);
  hr::test::expect_all_passed(ms, 6, 2);
}

INSTANTIATE_TEST_SUITE_P(Step, MixedPrecision, testing::Values(hr::BackendKind::cpu, hr::BackendKind::cuda),
                         hr::test::backend_param_name);

// The step's non-finite check over every gradient at once: any tensor's inf or NaN
// raises the one flag, and every tensor is unscaled.
class UnscaleAll : public testing::TestWithParam<hr::BackendKind> {};

TEST_P(UnscaleAll, OneFlagForEveryTensor) {
  HR_TEST_DEVICE(dev, GetParam());
  std::vector<hr::Tensor> ts;
  for (int64_t n : {7, 1024, 33})
    ts.push_back(hr::Tensor::from_host(dev, std::vector<float>(static_cast<size_t>(n), 3.f), {n}, hr::DType::f32,
                                       hr::Consumer::workspace));
  std::vector<hr::Tensor*> ptrs;
  for (auto& t : ts) ptrs.push_back(&t);
  EXPECT_FALSE(hr::ops::unscale_and_check_all(ptrs, 0.5f));
  for (auto& t : ts)
    for (float v : t.to_host_f32()) ASSERT_EQ(v, 1.5f);
  for (size_t k = 0; k < ts.size(); ++k) {
    std::vector<float> v = ts[k].to_host_f32();
    v.back() = std::numeric_limits<float>::quiet_NaN();
    ts[k].copy_from(hr::Tensor::from_host(dev, v, ts[k].shape(), hr::DType::f32, hr::Consumer::workspace));
    EXPECT_TRUE(hr::ops::unscale_and_check_all(ptrs, 1.f)) << k;
    v.back() = 1.f;
    ts[k].copy_from(hr::Tensor::from_host(dev, v, ts[k].shape(), hr::DType::f32, hr::Consumer::workspace));
  }
}

// Tensors of two devices are refused (on a GPU the kernels raise one flag on the
// first tensor's stream), here with two CPU devices, so nothing is unscaled.
TEST(UnscaleAllDevices, TensorsOfTwoDevicesAreRefused) {
  const std::unique_ptr<hr::Device> a = hr::make_cpu_device(), b = hr::make_cpu_device();
  hr::Tensor x = hr::Tensor::from_host(*a, {2.f, 4.f}, {2}, hr::DType::f32, hr::Consumer::workspace);
  hr::Tensor y = hr::Tensor::from_host(*b, {2.f, 4.f}, {2}, hr::DType::f32, hr::Consumer::workspace);
  std::vector<hr::Tensor*> both{&x, &y};
  EXPECT_THROW(hr::ops::unscale_and_check_all(both, 0.5f), hr::Error);
  EXPECT_EQ(x.to_host_f32(), (std::vector<float>{2.f, 4.f}));
  std::vector<hr::Tensor*> one{&x};
  EXPECT_FALSE(hr::ops::unscale_and_check_all(one, 0.5f));
  EXPECT_EQ(x.to_host_f32(), (std::vector<float>{1.f, 2.f}));
}

INSTANTIATE_TEST_SUITE_P(Ops, UnscaleAll, testing::Values(hr::BackendKind::cpu, hr::BackendKind::cuda),
                         hr::test::backend_param_name);

}  // namespace
