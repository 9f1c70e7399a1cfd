// GA-1..GA-4 (docs/catalogue.md): gradient accumulation against the full batch, per
// backend x dtype. The tests assert on the same property functions `headroom
// run` reports; the negative controls (no division by K, per-micro-batch token
// means on padded rows) must be caught by the same checks.
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "harness/check.hpp"
#include "harness/properties/accum_support.hpp"
#include "harness/properties/grad_accum.hpp"
#include "suites/common/property_check.hpp"
#include "suites/common/test_support.hpp"
#include "harness/tolerances.hpp"

namespace {

using hr::Measurement;
using hr::test::BackendDType;

constexpr uint64_t kSeed = 1234;

class GradAccum : public testing::TestWithParam<BackendDType> {};

// 2 models x (5 accumulating micro-batches + the buffer check and its fp16-buffer
// control at K = 4, 8, 32 + the 16-bit buffer control against the full batch). K = 1
// compares the reference with itself and is not counted as an accumulation check.
TEST_P(GradAccum, MatchesFullBatchGradient) {
  HR_TEST_DEVICE(dev, GetParam().backend);
  const auto ms = hr::props::ga1_accumulated_gradient(dev, GetParam().dtype, hr::Preset::quick, kSeed);
  hr::test::expect_all_passed(ms, 24, 8);
  for (const Measurement& m : ms) {
    EXPECT_EQ(m.id, "GA-1");
    EXPECT_GT(m.config["accum_steps"].get<int64_t>(), 1) << hr::test::describe(m);
    EXPECT_GT(hr::json_to_double(m.details["norm_full_batch"]), 0.0);
  }
}

// The fault fp32 accumulation exists to avoid: a 16-bit gradient buffer is caught
// at every dtype, by an error within 100x of the bound (a subtle control).
TEST_P(GradAccum, SixteenBitGradientBufferIsCaughtNearTheBound) {
  HR_TEST_DEVICE(dev, GetParam().backend);
  const auto ms = hr::props::ga1_accumulated_gradient(dev, GetParam().dtype, hr::Preset::quick, kSeed);
  int subtle = 0;
  for (const Measurement& m : ms) {
    if (m.control != "subtle") continue;
    ++subtle;
    EXPECT_TRUE(m.config.contains("grad_accum")) << hr::test::describe(m);
    EXPECT_TRUE(hr::test::passed(m));
    ASSERT_TRUE(m.power.has_value()) << hr::test::describe(m);
    EXPECT_LE(*m.power, hr::tol::kSubtleControlMaxPower);
  }
  EXPECT_EQ(subtle, 8);
}

// The buffer check sees an fp16 accumulation buffer at K = 4, 8 and 32 in every
// compute dtype (the 16-bit compute's own rounding is on both sides of it), and
// passes the fp32 buffer at the same K.
TEST_P(GradAccum, BufferCheckCatchesAnFp16BufferAtEveryK) {
  HR_TEST_DEVICE(dev, GetParam().backend);
  const auto ms = hr::props::ga1_accumulated_gradient(dev, GetParam().dtype, hr::Preset::quick, kSeed);
  std::map<std::pair<std::string, int64_t>, int> caught, passed;
  for (const Measurement& m : ms) {
    if (m.metric.rfind("max_tensor_rel_l2 against the float64 sum", 0) != 0) continue;
    const auto key = std::make_pair(m.model, m.config["accum_steps"].get<int64_t>());
    if (m.negative_control) {
      EXPECT_EQ(m.config.value("grad_accum", ""), "fp16");
      caught[key] += m.passed ? 1 : 0;
    } else {
      passed[key] += m.passed ? 1 : 0;
    }
  }
  for (const char* model : {"mlp", "transformer"})
    for (int64_t K : {4, 8, 32}) {
      const auto key = std::make_pair(std::string(model), K);
      EXPECT_EQ(caught[key], 1) << model << " K = " << K;
      EXPECT_EQ(passed[key], 1) << model << " K = " << K;
    }
}

// 2 models x (5 micro-batches x (caught, ratio) + dividing by K + 1 or, in fp32,
// the 16-bit buffer).
TEST_P(GradAccum, WithoutDivisionIsKTimesLargerAndCaught) {
  HR_TEST_DEVICE(dev, GetParam().backend);
  const auto ms = hr::props::ga2_no_division(dev, GetParam().dtype, hr::Preset::quick, kSeed);
  hr::test::expect_all_passed(ms, 24, 14);
  for (const Measurement& m : ms) {
    EXPECT_EQ(m.id, "GA-2");
    if (m.control == "subtle") continue;
    const double K = m.config["accum_steps"].get<double>();
    EXPECT_NEAR(m.details["norm_ratio"].get<double>(), K, K * 1e-2) << hr::test::describe(m);
  }
}

// Per model: SGD (2 micro-batches, no division, 16-bit buffer; the probe's
// resolution is a precondition) and AdamW (moments and two-step updates at 2
// micro-batches, 16-bit buffer, the step count frozen at 1).
TEST_P(GradAccum, OptimizerStepMatchesLargeBatchStep) {
  HR_TEST_DEVICE(dev, GetParam().backend);
  const auto ms = hr::props::ga3_optimizer_step(dev, GetParam().dtype, hr::Preset::quick, kSeed);
  hr::test::expect_all_passed(ms, 20, 8);
  for (const Measurement& m : ms) {
    // Updates, not parameters: a parameter-relative error would pass an update that
    // is a few percent wrong (one step moves hidden weights by ~3e-4 of their norm).
    if (m.config["optimizer"] == "sgd" && !m.negative_control) EXPECT_EQ(m.metric, "max_tensor_rel_l2_of_update");
    if (m.metric == "max_tensor_rel_l2_of_update" && !m.negative_control)
      EXPECT_LE(m.details["rounding_floor"].get<double>(), 0.1 * hr::tol::kGradAccumRelL2(GetParam().dtype));
  }
}

// 5 K x (per-micro-batch mean caught, window count correct), plus the growth.
TEST_P(GradAccum, PaddedRowsNeedTheWindowTokenCount) {
  HR_TEST_DEVICE(dev, GetParam().backend);
  const auto ms = hr::props::ga4_variable_length(dev, GetParam().dtype, hr::Preset::quick, kSeed);
  hr::test::expect_all_passed(ms, 12, 7);
  const Measurement& growth = ms.back();
  EXPECT_GT(growth.details["loglog_slope"].get<double>(), 0.0) << hr::test::describe(growth);
}

INSTANTIATE_TEST_SUITE_P(, GradAccum, testing::ValuesIn(hr::test::all_backend_dtypes()), hr::test::param_name);

// One dtype's exception is recorded as that dtype's error; the other dtypes run.
TEST(GradAccumRunner, OneDTypeThrowingKeepsTheOthers) {
  HR_TEST_DEVICE(dev, hr::BackendKind::cpu);
  hr::RunContext ctx{dev, hr::Preset::quick, kSeed, {}};
  const auto ms = hr::props::every_float_dtype(ctx, [](hr::Device&, hr::DType d, hr::Preset, uint64_t) {
    if (d == hr::DType::f16) throw hr::Error("fp16 broke");
    return std::vector<Measurement>{hr::make_check("GA-1", "ok", 0.0, 1e-5)};
  });
  ASSERT_EQ(ms.size(), 3u);
  EXPECT_TRUE(ms[0].passed);
  EXPECT_FALSE(ms[1].passed);
  EXPECT_EQ(ms[1].dtype, "fp16");
  EXPECT_EQ(ms[1].details.value("error", ""), "fp16 broke");
  EXPECT_TRUE(ms[2].passed);
}

// The comparison itself: a NaN is never within a bound, a tensor whose exact
// gradient is zero is measured against the whole gradient (only when the rule
// names it), a wrong value shows.
TEST(GradAccumCompare, FlagsNanAndDifferencesAndScalesNoiseTensorsByTheWhole) {
  using hr::props::NamedValues;
  const auto rule =
      hr::props::exact_zero_gradients(hr::props::accum_transformer_config(hr::DType::f32, 1, hr::Preset::quick));
  const NamedValues ref{{"h.0.attn.k.bias", {1e-9f, -1e-9f}}, {"h.0.attn.q.bias", {3.f, 4.f}}};
  NamedValues got = ref;
  EXPECT_EQ(hr::props::compare_tensors(got, ref, rule).max_rel_l2, 0.0);

  got[0].second = {-1e-9f, 1e-9f};  // noise against noise: tiny against the whole...
  auto c = hr::props::compare_tensors(got, ref, rule);
  EXPECT_LT(c.max_rel_l2, 1e-9);
  EXPECT_GT(hr::props::compare_tensors(got, ref).max_rel_l2, 1.0);  // ...but not without the rule

  got[1].second = {3.f, 4.5f};  // 0.5 / 5
  c = hr::props::compare_tensors(got, ref, rule);
  EXPECT_NEAR(c.max_rel_l2, 0.1, 1e-6);
  EXPECT_EQ(c.worst, "h.0.attn.q.bias");

  got[1].second = {3.f, NAN};
  c = hr::props::compare_tensors(got, ref, rule);
  EXPECT_TRUE(std::isnan(c.max_rel_l2));
  EXPECT_FALSE(hr::make_check("GA-1", "nan", c.max_rel_l2, 1e-5).passed);

  const NamedValues zeros{{"w", {0.f, 0.f}}};
  EXPECT_THROW(hr::props::compare_tensors(zeros, zeros), hr::Error);
}

// The rule names exactly the parameters whose gradient vanishes in exact arithmetic.
TEST(GradAccumCompare, ZeroGradientRuleNamesKeyBiasAndBiasesBeforeBatchNorm) {
  using namespace hr::props;
  const auto t = exact_zero_gradients(accum_transformer_config(hr::DType::f32, 1, hr::Preset::quick));
  EXPECT_TRUE(t("h.1.attn.k.bias"));
  EXPECT_FALSE(t("h.1.attn.q.bias"));
  EXPECT_FALSE(t("h.1.attn.k.weight"));
  const auto bn = exact_zero_gradients(accum_mlp_config(hr::DType::f32, 1, hr::Preset::quick, hr::NormKind::batchnorm));
  EXPECT_TRUE(bn("layers.0.bias"));
  EXPECT_TRUE(bn("layers.2.bias"));
  EXPECT_FALSE(bn("layers.3.bias"));  // the head: no norm after it
  EXPECT_FALSE(bn("layers.0.weight"));
  EXPECT_FALSE(static_cast<bool>(exact_zero_gradients(accum_mlp_config(hr::DType::f32, 1, hr::Preset::quick))));
  EXPECT_FALSE(static_cast<bool>(
      exact_zero_gradients(accum_mlp_config(hr::DType::f32, 1, hr::Preset::quick, hr::NormKind::layernorm))));
}

}  // namespace
