// CK-1, CK-2, CK-4, CK-5 and GA-6 (docs/catalogue.md) per backend x dtype, asserting on
// the functions `headroom run` registers: checkpointed gradients with dropout on are
// the plain run's bit for bit at k in {1, 2, ceil(sqrt L), L}; a fresh RNG state, a
// never-recomputing schedule and running-offset masks under accumulation are caught,
// and so are their subtle forms (one mask element, one extra block forward, a 16-bit
// buffer). Also the keying itself: a sample's mask does not depend on its micro-batch.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "harness/properties/accum_support.hpp"
#include "harness/properties/checkpoint_depth.hpp"
#include "harness/properties/checkpointing.hpp"
#include "harness/step/dropout_keys.hpp"
#include "harness/step/train_step.hpp"
#include "suites/common/property_check.hpp"
#include "suites/common/test_support.hpp"

namespace {

using hr::Measurement;
using hr::test::BackendDType;

constexpr uint64_t kSeed = 1234;

size_t count_control(const std::vector<Measurement>& ms, const char* control) {
  return static_cast<size_t>(
      std::count_if(ms.begin(), ms.end(), [&](const Measurement& m) { return m.control == control; }));
}

void expect_ids(const std::vector<Measurement>& ms, const char* id) {
  for (const Measurement& m : ms) EXPECT_EQ(m.id, id) << hr::test::describe(m);
}

class Checkpointing : public testing::TestWithParam<BackendDType> {};

// Three segment sizes (1, 2, 4 of 4 blocks) on both models; the fresh-state control
// on both; the one-element flip (33 gradient values) on the MLP.
TEST_P(Checkpointing, GradientsBitwiseEqualWithDropoutReplayed) {
  HR_TEST_DEVICE(dev, GetParam().backend);
  const auto ms = hr::props::ck1_bitwise_replay(dev, GetParam().dtype, hr::Preset::quick, kSeed);
  hr::test::expect_all_passed(ms, 9, 3);
  EXPECT_EQ(count_control(ms, "subtle"), 1u);
  expect_ids(ms, "CK-1");
  for (const Measurement& m : ms)
    if (!m.negative_control) EXPECT_EQ(m.error, 0.0) << hr::test::describe(m);
}

TEST_P(Checkpointing, FreshRngChangesGradientsAndIsCaught) {
  HR_TEST_DEVICE(dev, GetParam().backend);
  const auto ms = hr::props::ck2_fresh_rng(dev, GetParam().dtype, hr::Preset::quick, kSeed);
  hr::test::expect_all_passed(ms, 5, 5);
  EXPECT_EQ(count_control(ms, "subtle"), 1u);
  expect_ids(ms, "CK-2");
}

// Counted inside the blocks: 2 K per block checkpointed, K plain; the extra
// forward is about a third of the step's matrix work.
TEST_P(Checkpointing, EachSegmentRunsItsForwardExactlyTwice) {
  HR_TEST_DEVICE(dev, GetParam().backend);
  const auto ms = hr::props::ck4_forward_counts(dev, GetParam().dtype, hr::Preset::quick, kSeed);
  hr::test::expect_all_passed(ms, 14, 6);
  EXPECT_EQ(count_control(ms, "subtle"), 4u);  // one per check per model
  expect_ids(ms, "CK-4");
  for (const Measurement& m : ms)
    if (m.details.contains("extra_flops_over_step")) {
      const double f = m.details.at("extra_flops_over_step").get<double>();
      EXPECT_GT(f, 0.25) << hr::test::describe(m);
      EXPECT_LT(f, 0.34) << hr::test::describe(m);
    }
}

TEST_P(Checkpointing, EverySiteReplaysItsMask) {
  HR_TEST_DEVICE(dev, GetParam().backend);
  const auto ms = hr::props::ck5_every_site(dev, GetParam().dtype, hr::Preset::quick, kSeed);
  hr::test::expect_all_passed(ms, 10, 4);
  EXPECT_EQ(count_control(ms, "subtle"), 2u);
  expect_ids(ms, "CK-5");
  for (const Measurement& m : ms)
    if (m.metric == "mask_mismatches") EXPECT_GT(m.details.at("compared_mask_elements").get<int64_t>(), 0);
}

TEST_P(Checkpointing, KeyedDropoutAccumulatesToTheFullBatch) {
  HR_TEST_DEVICE(dev, GetParam().backend);
  const auto ms = hr::props::ga6_keyed_dropout(dev, GetParam().dtype, hr::Preset::quick, kSeed);
  hr::test::expect_all_passed(ms, 8, 4);
  EXPECT_EQ(count_control(ms, "subtle"), 2u);
  expect_ids(ms, "GA-6");
}

INSTANTIATE_TEST_SUITE_P(, Checkpointing, testing::ValuesIn(hr::test::all_backend_dtypes()), hr::test::param_name);

// CK-3 on the CPU (byte counts; the fit is the same at any seed): ~1 plain, <= 0.65
// with sqrt(L) segments for the activations and for the whole pass, and with every
// block; no checkpointing and L/4-block segments fail the sqrt(L) bound, and the
// driver's switches (recomputed activations kept, every block checkpointed when
// told not to) fail the bound of each check.
TEST(CheckpointDepth, ExponentsFromTheSweepMeetTheirBounds) {
  HR_TEST_DEVICE(dev, hr::BackendKind::cpu);
  const auto ms = hr::props::ck3_depth_exponents(dev, hr::DType::f32, hr::Preset::quick, kSeed);
  hr::test::expect_all_passed(ms, 10, 6);
  EXPECT_EQ(count_control(ms, "subtle"), 5u);
  expect_ids(ms, "CK-3");
  for (const Measurement& m : ms) EXPECT_EQ(m.details.at("points").size(), 4u) << hr::test::describe(m);
}

// Every registered CK / GA-6 property passes at seeds other than the test's, with
// every dtype's measurements present.
class CheckpointingSeeds : public testing::TestWithParam<uint64_t> {};

TEST_P(CheckpointingSeeds, EveryDTypePassesAtThisSeed) {
  HR_TEST_DEVICE(dev, hr::BackendKind::cpu);
  for (const std::string id : {"CK-1", "CK-2", "CK-4", "CK-5", "GA-6"}) {
    std::vector<Measurement> ms;
    for (const auto& spec : hr::property_registry())
      if (spec.id == id) {
        hr::RunContext ctx{dev, hr::Preset::quick, GetParam(), {}};
        ms = spec.run(ctx);
      }
    ASSERT_FALSE(ms.empty()) << id;
    for (const Measurement& m : ms) EXPECT_TRUE(hr::test::passed(m));
    for (const char* dtype : {"fp32", "fp16", "bf16"})
      EXPECT_GT(std::count_if(ms.begin(), ms.end(), [&](const Measurement& m) { return m.dtype == dtype; }), 0)
          << id << " " << dtype;
  }
}

INSTANTIATE_TEST_SUITE_P(, CheckpointingSeeds, testing::Values(uint64_t{3}, uint64_t{77}));

// Why CK-1 and BN-3 read the blocks' own counters: a driver that is told to
// checkpoint but never recomputes gives the plain run's gradients bit for bit, so the
// comparison alone would pass; the blocks' counters show one forward, not two.
TEST(CheckpointFaults, NeverRecomputingPassesTheComparisonButNotTheCount) {
  HR_TEST_DEVICE(dev, hr::BackendKind::cpu);
  hr::StepConfig cfg = hr::props::ck_config(hr::ModelKind::mlp, hr::DType::f32, hr::Preset::quick);
  const hr::Batch batch = hr::props::accum_batch(dev, cfg, 9);
  auto run = [&](const hr::StepConfig& c, std::vector<int64_t>* counts) {
    hr::TrainStep step(dev, c);
    step.model().reset_block_forward_counts();
    step.forward_backward(batch);
    *counts = step.model().block_forward_counts();
    return hr::props::gradient_values(step);
  };
  std::vector<int64_t> plain_counts, never_counts, ck_counts;
  hr::StepConfig never = cfg, ck = cfg;
  never.checkpoint.every_k_blocks = ck.checkpoint.every_k_blocks = 1;
  never.checkpoint.fault_never_recompute = true;
  const auto plain = run(cfg, &plain_counts);
  EXPECT_EQ(run(never, &never_counts), plain);
  EXPECT_EQ(run(ck, &ck_counts), plain);
  const int64_t K = cfg.accum_steps();
  EXPECT_EQ(never_counts, std::vector<int64_t>(plain_counts.size(), K));
  EXPECT_EQ(ck_counts, std::vector<int64_t>(plain_counts.size(), 2 * K));
}

// GA-6's premise: sample g's mask is the same whether it sits in a micro-batch of 1,
// 4 or 8 rows, at any position; under the running-offset scheme the other blocks'
// draws in between move it.
TEST(DropoutKeys, SampleMaskIndependentOfItsMicroBatch) {
  HR_TEST_DEVICE(dev, hr::BackendKind::cpu);
  const float p = 0.3f;
  const int64_t width = 40, g = 5;
  auto mask_of_sample = [&](hr::DropoutKeying keying, int64_t micro_batch) {
    hr::DropoutStream rng;
    rng.keying = keying;
    rng.seed = 99;
    hr::DropoutDraw d;
    for (int64_t first = 0; first <= g; first += micro_batch) {  // up to g's micro-batch, two blocks each
      rng.sample0 = first;
      d = rng.take(0, hr::DropoutSite::hidden, {micro_batch, width}, micro_batch);
      rng.take(1, hr::DropoutSite::hidden, {micro_batch, width}, micro_batch);
    }
    hr::Tensor m = hr::Tensor::empty(dev, {micro_batch, width}, hr::DType::u8, hr::Consumer::workspace);
    hr::dropout_draw_mask(d, p, m);
    const int64_t row = g % micro_batch;
    return m.slice(row, row + 1).to_host_bytes();
  };
  const auto one = mask_of_sample(hr::DropoutKeying::per_sample, 1);
  EXPECT_EQ(mask_of_sample(hr::DropoutKeying::per_sample, 4), one);
  EXPECT_EQ(mask_of_sample(hr::DropoutKeying::per_sample, 8), one);
  EXPECT_NE(mask_of_sample(hr::DropoutKeying::running_offset, 4), mask_of_sample(hr::DropoutKeying::running_offset, 8));
  // And the sites of a block and the blocks differ from each other.
  hr::DropoutStream rng;
  rng.seed = 99;
  const hr::DropoutDraw a = rng.take(0, hr::DropoutSite::attn_out, {8, 16}, 2);
  const hr::DropoutDraw b = rng.take(0, hr::DropoutSite::mlp_out, {8, 16}, 2);
  const hr::DropoutDraw c = rng.take(1, hr::DropoutSite::attn_out, {8, 16}, 2);
  EXPECT_NE(a.first, b.first);
  EXPECT_NE(a.first, c.first);
  EXPECT_NE(b.first, c.first);
}

}  // namespace
