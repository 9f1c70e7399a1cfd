// The controlled MLP under the training step: regression and classification
// learn in fp32, fp16 and bf16 with each norm slot; checkpointing reproduces the
// gradients bit for bit with dropout on, counts two forwards per segment, and
// does not update BatchNorm running statistics twice (the broken variant does);
// ghost BatchNorm over virtual batches differs from whole-micro-batch BatchNorm.
#include <gtest/gtest.h>

#include <cmath>

#include "harness/data/synthetic.hpp"
#include "harness/models/mlp.hpp"
#include "harness/step/train_step.hpp"
#include "suites/common/step_support.hpp"
#include "suites/common/test_support.hpp"
#include "harness/tolerances.hpp"

namespace {

using namespace hr;
using hr::test::BackendDType;

class MlpStep : public testing::TestWithParam<BackendDType> {};

TEST_P(MlpStep, LossDecreasesAndGradientsStayFinite) {
  HR_TEST_DEVICE(dev, GetParam().backend);
  for (MlpTask task : {MlpTask::regression, MlpTask::classification}) {
    for (NormKind norm : {NormKind::none, NormKind::layernorm, NormKind::batchnorm}) {
      SCOPED_TRACE(std::string(mlp_task_name(task)) + " / " + norm_kind_name(norm));
      StepConfig cfg = test::tiny_mlp_config(GetParam().dtype, norm);
      cfg.mlp.task = task;
      cfg.mlp.dropout = 0.1f;
      cfg.optimizer.kind = OptimizerKind::adamw;
      cfg.optimizer.adamw.lr = 1e-2f;
      TrainStep step(dev, cfg);
      const Batch batch = make_mlp_batch(dev, cfg.mlp, cfg.batch, 21);
      double first = 0, last = 0;
      for (int s = 0; s < 8; ++s) {
        const StepResult r = step.step(batch);
        ASSERT_TRUE(std::isfinite(r.loss)) << "step " << s;
        EXPECT_FALSE(r.skipped);
        const auto g = test::flat(test::grad_values(step));
        ASSERT_TRUE(test::all_finite(g)) << "step " << s;
        ASSERT_GT(test::squared_norm(g), 0.0) << "step " << s;
        if (s == 0) first = r.loss;
        last = r.loss;
      }
      EXPECT_LT(last, tol::kTrainingLossDropFactor * first) << "first " << first << " last " << last;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Models, MlpStep, testing::ValuesIn(test::all_backend_dtypes()), test::param_name);

class MlpCheckpoint : public testing::TestWithParam<BackendKind> {};

TEST_P(MlpCheckpoint, GradientsBitwiseEqualWithDropout) {
  HR_TEST_DEVICE(dev, GetParam());
  for (NormKind norm : {NormKind::none, NormKind::layernorm, NormKind::batchnorm}) {
    SCOPED_TRACE(norm_kind_name(norm));
    StepConfig cfg = test::tiny_mlp_config(DType::f32, norm);
    cfg.mlp.layers = 5;  // four blocks
    cfg.mlp.dropout = 0.25f;
    const Batch batch = make_mlp_batch(dev, cfg.mlp, cfg.batch, 8);
    test::expect_checkpointing_replays_dropout(dev, cfg, batch, 4, {1, 2, 4});
  }
}

// The recompute normalises with the same batch statistics but must not fold
// them into the running statistics a second time.
TEST_P(MlpCheckpoint, BatchNormRunningStatisticsUpdatedOnce) {
  HR_TEST_DEVICE(dev, GetParam());
  StepConfig cfg = test::tiny_mlp_config(DType::f32, NormKind::batchnorm);
  const Batch batch = make_mlp_batch(dev, cfg.mlp, cfg.batch, 8);
  auto stats = [&](int64_t k, bool broken) {
    StepConfig c = cfg;
    c.checkpoint.every_k_blocks = k;
    c.checkpoint.update_bn_stats_on_recompute = broken;
    TrainStep s(dev, c);
    s.forward_backward(batch);
    std::vector<uint8_t> out;
    for (const auto& [name, t] : s.model().buffers()) {
      const auto b = t.to_host_bytes();
      out.insert(out.end(), b.begin(), b.end());
    }
    return out;
  };
  const auto base = stats(0, false);
  EXPECT_EQ(bitwise_mismatches(base, stats(1, false)), 0u);
  EXPECT_GT(bitwise_mismatches(base, stats(1, true)), 0u);
}

INSTANTIATE_TEST_SUITE_P(Models, MlpCheckpoint, testing::Values(BackendKind::cpu, BackendKind::cuda),
                         test::backend_param_name);

// BN-2's ingredient: ghost BatchNorm (virtual batches of 4 inside micro-batches
// of 16) gives other gradients than BatchNorm over the whole micro-batch, and
// equal ones when the virtual batch is the micro-batch.
TEST(MlpGhostBatchNorm, VirtualBatchChangesStatistics) {
  HR_TEST_DEVICE(dev, BackendKind::cpu);
  StepConfig cfg = test::tiny_mlp_config(DType::f32, NormKind::batchnorm);
  const Batch batch = make_mlp_batch(dev, cfg.mlp, cfg.batch, 8);
  auto grads = [&](int64_t vb) {
    StepConfig c = cfg;
    c.mlp.bn_virtual_batch = vb;
    TrainStep s(dev, c);
    s.forward_backward(batch);
    return test::flat(test::grad_values(s));
  };
  const auto whole = grads(0);
  EXPECT_EQ(rel_l2(grads(16), whole), 0.0);
  EXPECT_GT(rel_l2(grads(4), whole), 1e-3);
}

}  // namespace
