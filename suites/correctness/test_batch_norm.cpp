// BN-1..BN-3 (PROPERTIES.md): BatchNorm under gradient accumulation and
// checkpointing, per backend x dtype. BN-1's divergence is a negative control
// (micro-batches of 2 must NOT reproduce the batch of 32, and the check must see
// it); LayerNorm and ghost batch norm are the positive controls; BN-3's double
// update of the running statistics on recompute must be caught.
#include <gtest/gtest.h>

#include "harness/properties/batch_norm.hpp"
#include "suites/common/property_check.hpp"
#include "suites/common/test_support.hpp"

namespace {

using hr::Measurement;
using hr::test::BackendDType;

constexpr uint64_t kSeed = 1234;

class BatchNormAccum : public testing::TestWithParam<BackendDType> {};

// BatchNorm gradients and running statistics diverge; LayerNorm agrees.
TEST_P(BatchNormAccum, DivergesUnderAccumulationWhileLayerNormAgrees) {
  HR_TEST_DEVICE(dev, GetParam().backend);
  const auto ms = hr::props::bn1_accumulation_diverges(dev, GetParam().dtype, hr::Preset::quick, kSeed);
  hr::test::expect_all_passed(ms, 3, 2);
  for (const Measurement& m : ms) EXPECT_EQ(m.id, "BN-1");
}

// Virtual batches of 2, 4 and 8: gradients and running statistics.
TEST_P(BatchNormAccum, GhostBatchNormReproducesAccumulation) {
  HR_TEST_DEVICE(dev, GetParam().backend);
  const auto ms = hr::props::bn2_ghost_batch_norm(dev, GetParam().dtype, hr::Preset::quick, kSeed);
  hr::test::expect_all_passed(ms, 6, 0);
  for (const Measurement& m : ms) EXPECT_EQ(m.id, "BN-2");
}

// Recomputed (forward counted twice), running statistics as without
// checkpointing; the double update is caught.
TEST_P(BatchNormAccum, CheckpointRecomputeUpdatesRunningStatsOnce) {
  HR_TEST_DEVICE(dev, GetParam().backend);
  const auto ms = hr::props::bn3_checkpoint_running_stats(dev, GetParam().dtype, hr::Preset::quick, kSeed);
  hr::test::expect_all_passed(ms, 2, 1);
  for (const Measurement& m : ms) {
    EXPECT_EQ(m.id, "BN-3");
    EXPECT_TRUE(m.details["recomputed"].get<bool>()) << hr::test::describe(m);
  }
}

INSTANTIATE_TEST_SUITE_P(, BatchNormAccum, testing::ValuesIn(hr::test::all_backend_dtypes()),
                         hr::test::param_name);

}  // namespace
