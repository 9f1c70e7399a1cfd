// BN-1..BN-3 (docs/catalogue.md): BatchNorm under gradient accumulation and
// checkpointing, per backend x dtype. BN-1's divergence is a negative control
// (micro-batches of 2 must NOT reproduce the batch of 32, and the check must see
// it); LayerNorm and ghost batch norm are the positive controls; BN-3's double
// update of the running statistics on recompute must be caught. Every property
// carries subtle controls (faults within 10-100x of the bound), and must hold at
// the seeds that once broke it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>

#include <nlohmann/json.hpp>

#include "harness/check.hpp"
#include "harness/properties/batch_norm.hpp"
#include "harness/step/step_config.hpp"
#include "suites/common/property_check.hpp"
#include "suites/common/test_support.hpp"

namespace {

using hr::Measurement;
using hr::test::BackendDType;

constexpr uint64_t kSeed = 1234;

size_t count_subtle(const std::vector<Measurement>& ms) {
  size_t n = 0;
  for (const Measurement& m : ms) n += m.control == "subtle" ? 1 : 0;
  return n;
}

class BatchNormAccum : public testing::TestWithParam<BackendDType> {};

// BatchNorm gradients and running statistics diverge, also at 2 micro-batches of
// 16 (subtle); LayerNorm agrees, and a LayerNorm leaking the batch mean is caught.
TEST_P(BatchNormAccum, DivergesUnderAccumulationWhileLayerNormAgrees) {
  HR_TEST_DEVICE(dev, GetParam().backend);
  const auto ms = hr::props::bn1_accumulation_diverges(dev, GetParam().dtype, hr::Preset::quick, kSeed);
  hr::test::expect_all_passed(ms, 5, 4);
  EXPECT_EQ(count_subtle(ms), 2u);
  for (const Measurement& m : ms) EXPECT_EQ(m.id, "BN-1");
}

// Virtual batches of 2, 4 and 8: gradients (bound from the batch's BatchNorm
// conditioning) and running statistics; a ghost batch leaking a fraction of its
// neighbour's rows is caught by the statistics at every size and by the
// gradients at 4 and 8; at 2 the gradients catch a backward whose dgamma is off.
TEST_P(BatchNormAccum, GhostBatchNormReproducesAccumulation) {
  HR_TEST_DEVICE(dev, GetParam().backend);
  const auto ms = hr::props::bn2_ghost_batch_norm(dev, GetParam().dtype, hr::Preset::quick, kSeed);
  hr::test::expect_all_passed(ms, 12, 6);
  EXPECT_EQ(count_subtle(ms), 6u);
  for (const Measurement& m : ms) {
    EXPECT_EQ(m.id, "BN-2");
    const double kappa = hr::json_to_double(m.details.at("batchnorm_conditioning"));
    EXPECT_TRUE(std::isfinite(kappa) && kappa > 0) << hr::test::describe(m);
  }
}

// Recomputed (forward counted twice): running statistics and gradients bitwise
// as without checkpointing; the double update is caught, in every channel and
// in one channel of each BatchNorm, and one gradient element one ulp off.
TEST_P(BatchNormAccum, CheckpointRecomputeUpdatesRunningStatsOnce) {
  HR_TEST_DEVICE(dev, GetParam().backend);
  const auto ms = hr::props::bn3_checkpoint_running_stats(dev, GetParam().dtype, hr::Preset::quick, kSeed);
  hr::test::expect_all_passed(ms, 5, 3);
  EXPECT_EQ(count_subtle(ms), 2u);
  for (const Measurement& m : ms) {
    EXPECT_EQ(m.id, "BN-3");
    EXPECT_EQ(m.metric, "bitwise_mismatches") << hr::test::describe(m);
    EXPECT_TRUE(m.details["recomputed"].get<bool>()) << hr::test::describe(m);
    if (!m.negative_control) EXPECT_EQ(m.error, 0.0) << hr::test::describe(m);
  }
}

INSTANTIATE_TEST_SUITE_P(, BatchNormAccum, testing::ValuesIn(hr::test::all_backend_dtypes()),
                         hr::test::param_name);

// The registered properties at seeds that broke them: 7 overflowed fp16
// BatchNorm over 2 rows at the initial loss scale (the property threw and took
// the fp32 and bf16 measurements with it); 42 took BN-2's fp32 gradient error past
// a fixed bound; 39 has the largest fp32 error of seeds 1-500 (5.4e-2 at a
// virtual batch of 2). Every dtype's measurements come back and pass.
class BatchNormSeeds : public testing::TestWithParam<uint64_t> {};

TEST_P(BatchNormSeeds, EveryDTypePassesAtThisSeed) {
  HR_TEST_DEVICE(dev, hr::BackendKind::cpu);
  for (const std::string id : {"BN-1", "BN-2", "BN-3"}) {
    std::vector<Measurement> ms;
    for (const auto& spec : hr::property_registry())
      if (spec.id == id) {
        hr::RunContext ctx{dev, hr::Preset::quick, GetParam(), {}};
        ms = spec.run(ctx);
      }
    const size_t per_dtype = id == "BN-1" ? 5 : id == "BN-2" ? 12 : 5;
    ASSERT_EQ(ms.size(), 3 * per_dtype) << id;
    for (const Measurement& m : ms) EXPECT_TRUE(hr::test::passed(m));
    for (const char* dtype : {"fp32", "fp16", "bf16"})
      EXPECT_EQ(static_cast<size_t>(std::count_if(ms.begin(), ms.end(),
                                                  [&](const Measurement& m) { return m.dtype == dtype; })),
                per_dtype)
          << id << " " << dtype;
  }
}

INSTANTIATE_TEST_SUITE_P(, BatchNormSeeds, testing::Values(uint64_t{7}, uint64_t{42}, uint64_t{39}));

// At seed 7 fp16 does overflow at the initial scale: the comparison reruns at a
// backed-off scale instead of throwing (the case the test above must cover).
TEST(BatchNormOverflow, Fp16BacksOffTheLossScale) {
  HR_TEST_DEVICE(dev, hr::BackendKind::cpu);
  const auto ms = hr::props::bn1_accumulation_diverges(dev, hr::DType::f16, hr::Preset::quick, 7);
  ASSERT_FALSE(ms.empty());
  const auto& precision = ms.front().details.at("precision");
  EXPECT_GT(precision.at("loss_scale_backoffs").get<int>(), 0) << precision.dump();
  EXPECT_TRUE(precision.at("finite").get<bool>()) << precision.dump();
}

// The fault knobs behind the subtle controls are validated like every field.
TEST(BatchNormFaults, KnobsAreValidated) {
  hr::StepConfig c = hr::step_config_for(hr::ModelKind::mlp, hr::Preset::quick);
  c.mlp.fault_ln_batch_leak = -0.1f;
  EXPECT_THROW(hr::validate(c), hr::InvalidArgument);
  c.mlp.fault_ln_batch_leak = 0.f;
  c.mlp.fault_ghost_bn_neighbour_leak = 1.5f;
  EXPECT_THROW(hr::validate(c), hr::InvalidArgument);
  c.mlp.fault_ghost_bn_neighbour_leak = 0.f;
  c.mlp.fault_bn_recompute_channels = -1;
  EXPECT_THROW(hr::validate(c), hr::InvalidArgument);
  c.mlp.fault_bn_recompute_channels = 1;
  c.mlp.fault_ln_batch_leak = 0.25f;
  EXPECT_NO_THROW(hr::validate(c));
  // A configuration written with a fault reads back with it.
  nlohmann::json j;
  hr::to_json(j, c);
  const hr::StepConfig back = hr::step_config_from_json(j, hr::step_config_for(hr::ModelKind::mlp, hr::Preset::quick));
  EXPECT_EQ(back.mlp.fault_bn_recompute_channels, 1);
  EXPECT_EQ(back.mlp.fault_ln_batch_leak, 0.25f);
  EXPECT_EQ(back.mlp.fault_ghost_bn_neighbour_leak, 0.f);
}

}  // namespace
