// Synthetic data: the length distribution has the configured p95 and maximum;
// padded and packed language-modelling batches mark padding and boundaries with
// the ignore index, restart positions and number segments; MLP batches are
// deterministic per seed; the gradient-magnitude knob lands the median gradient
// where asked.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "harness/check.hpp"
#include "harness/data/packing.hpp"
#include "harness/data/synthetic.hpp"
#include "harness/step/train_step.hpp"
#include "suites/common/step_support.hpp"
#include "suites/common/test_support.hpp"

namespace {

using namespace hr;

double percentile(std::vector<int64_t> v, double q) {
  std::sort(v.begin(), v.end());
  return static_cast<double>(v[static_cast<size_t>(q * static_cast<double>(v.size() - 1))]);
}

TEST(SyntheticData, LengthDistributionHasTheConfiguredTail) {
  const LengthDistribution d;  // p95 900, max 4096
  const auto len = sample_lengths(d, 20000, 5);
  EXPECT_NEAR(percentile(len, 0.95), 900.0, 900.0 * 0.05);
  EXPECT_LE(*std::max_element(len.begin(), len.end()), 4096);
  EXPECT_GE(*std::min_element(len.begin(), len.end()), 1);
  EXPECT_LT(percentile(len, 0.5), 400.0);  // a long tail: the median is far below p95
  const LengthDistribution s = d.scaled(128);
  const auto small = sample_lengths(s, 20000, 5);
  EXPECT_EQ(s.max, 128);
  EXPECT_NEAR(percentile(small, 0.95), 900.0 * 128 / 4096, 2.0);
  EXPECT_LE(*std::max_element(small.begin(), small.end()), 128);
  EXPECT_EQ(sample_lengths(d, 100, 5), std::vector<int64_t>(len.begin(), len.begin() + 100));
}

TEST(SyntheticData, PaddedBatchIgnoresPaddingAndFollowsTheTask) {
  HR_TEST_DEVICE(dev, BackendKind::cpu);
  TransformerConfig cfg;
  const Batch b = make_lm_batch(dev, cfg, 3, 10, 1, {10, 4, 1});
  const auto ids = b.ids.to_host_i32(), tg = b.targets.to_host_i32(), valid = b.key_valid_len.to_host_i32();
  EXPECT_EQ(valid, (std::vector<int32_t>{10, 4, 1}));
  for (int r = 0; r < 3; ++r)
    for (int i = 0; i < 10; ++i) {
      const int32_t t = tg[static_cast<size_t>(r * 10 + i)];
      if (i + 1 < valid[static_cast<size_t>(r)]) {
        EXPECT_EQ(t, ids[static_cast<size_t>(r * 10 + i + 1)]);  // next token
      } else {
        EXPECT_EQ(t, cfg.ignore_index);
      }
    }
  EXPECT_EQ(make_lm_batch(dev, cfg, 3, 10, 1).ids.to_host_i32()[0], ids[0]);
}

TEST(SyntheticData, PackedBatchRestartsPositionsAndSeparatesSegments) {
  HR_TEST_DEVICE(dev, BackendKind::cpu);
  TransformerConfig cfg;
  const Batch b = make_packed_lm_batch(dev, cfg, 2, 16, {9, 7, 5, 4, 3}, 2);
  const auto pos = b.pos.to_host_i32(), seg = b.segment_ids.to_host_i32(), tg = b.targets.to_host_i32();
  int64_t real_targets = 0;
  for (size_t k = 0; k < pos.size(); ++k) {
    if (k % 16 != 0 && seg[k] != seg[k - 1]) EXPECT_EQ(pos[k], 0) << k;  // a new segment starts at 0
    if (k % 16 != 15 && seg[k] != seg[k + 1]) EXPECT_EQ(tg[k], cfg.ignore_index) << k;  // no target across
    real_targets += tg[k] != cfg.ignore_index;
  }
  EXPECT_EQ(real_targets, (9 - 1) + (7 - 1) + (5 - 1) + (4 - 1) + (3 - 1));
  EXPECT_THROW(make_packed_lm_batch(dev, cfg, 1, 16, {9, 9}, 2), InvalidArgument);
}

// Every batch the pipeline makes keeps the host values its integer tensors were
// uploaded from, and a slice keeps its rows' values; the ops trust them, so they
// must equal the device tensors exactly.
TEST(SyntheticData, BatchesKeepTheirIntegerTensorsOnTheHost) {
  auto dev = make_cpu_device();
  const StepConfig lm = test::tiny_transformer_config();
  const TransformerConfig& tc = lm.transformer;
  StepConfig cls = test::tiny_mlp_config();
  cls.mlp.task = MlpTask::classification;
  const std::vector<std::pair<const char*, Batch>> batches = {
      {"lm", make_lm_batch(*dev, tc, 6, 12, 3)},
      {"padded lm", make_lm_batch(*dev, tc, 6, 12, 3, {3, 12, 7, 1, 9, 4})},
      {"padded sequences", make_padded_batch(*dev, tc, make_lm_sequences(tc, {3, 7, 5}, 3), 12, 0)},
      {"packed lm", make_packed_lm_batch(*dev, tc, 4, 12, {3, 12, 7, 1, 9, 4}, 3)},
      {"mlp classification", make_mlp_batch(*dev, cls.mlp, 6, 3)},
  };
  auto expect_mirrors = [](const Batch& b, const std::string& what) {
    ASSERT_NE(b.host, nullptr) << what;
    for (const auto& [t, h] : {std::pair{&b.ids, b.host_ids()}, std::pair{&b.pos, b.host_pos()},
                               std::pair{&b.targets, b.host_targets()}}) {
      ASSERT_EQ(t->defined(), h != nullptr) << what;
      if (h) EXPECT_EQ(*h, t->to_host_i32()) << what;
    }
  };
  for (const auto& [name, b] : batches) {
    expect_mirrors(b, name);
    expect_mirrors(b.slice(1, 3), std::string(name) + " rows 1-2");
    expect_mirrors(b.slice(b.rows() - 1, b.rows()), std::string(name) + " last row");
  }
  // A regression batch has no integer tensor: nothing to keep.
  EXPECT_EQ(make_mlp_batch(*dev, test::tiny_mlp_config().mlp, 4, 3).host, nullptr);
  Batch wrong = make_lm_batch(*dev, tc, 2, 12, 3);
  EXPECT_THROW(wrong.keep_host_index(std::vector<int32_t>(23), wrong.host->pos, wrong.host->targets), Error);
}

TEST(SyntheticData, GradientMagnitudeKnobLandsTheMedian) {
  HR_TEST_DEVICE(dev, BackendKind::cpu);
  StepConfig cfg = test::tiny_mlp_config();
  TrainStep probe(dev, cfg);
  const Batch batch = make_mlp_batch(dev, cfg.mlp, cfg.batch, 4);
  const double target = std::ldexp(1.0, -26);  // below fp16's smallest subnormal
  cfg.loss_multiplier = loss_multiplier_for_grad_magnitude(probe, batch, target);
  TrainStep step(dev, cfg);
  step.forward_backward(batch);
  std::vector<float> mags;
  for (const auto& [n, g] : step.gradients())
    for (float v : g.to_host_f32())
      if (v != 0.f) mags.push_back(std::fabs(v));
  std::nth_element(mags.begin(), mags.begin() + static_cast<std::ptrdiff_t>(mags.size() / 2), mags.end());
  EXPECT_NEAR(mags[mags.size() / 2] / target, 1.0, 1e-3);
}

}  // namespace
