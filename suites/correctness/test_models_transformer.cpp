// The controlled transformer under the training step: it learns (loss falls,
// gradients finite and non-zero) in fp32, fp16 and bf16; its full fp32 gradient
// matches float64 finite differences of an independent float64 reference
// (padding mask and ignore index included); checkpointing reproduces the
// gradients bit for bit with dropout on, and the fresh-RNG variant does not.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "harness/data/synthetic.hpp"
#include "harness/step/train_step.hpp"
#include "suites/common/ref_transformer.hpp"
#include "suites/common/step_support.hpp"
#include "suites/common/test_support.hpp"
#include "harness/tolerances.hpp"

namespace {

using namespace hr;
using hr::test::BackendDType;

class TransformerStep : public testing::TestWithParam<BackendDType> {};

TEST_P(TransformerStep, LossDecreasesAndGradientsStayFinite) {
  HR_TEST_DEVICE(dev, GetParam().backend);
  for (bool mem_eff : {false, true}) {
    SCOPED_TRACE(mem_eff ? "memory-efficient attention" : "naive attention");
    StepConfig cfg = test::tiny_transformer_config(GetParam().dtype);
    cfg.transformer.dropout = 0.1f;
    cfg.transformer.memory_efficient_attention = mem_eff;
    cfg.optimizer.kind = OptimizerKind::adamw;
    cfg.optimizer.adamw.lr = 1e-2f;
    TrainStep step(dev, cfg);
    // Padded rows: the mask slot and the ignore index are exercised too.
    const std::vector<int64_t> lengths{12, 7, 12, 9};
    const Batch batch = make_lm_batch(dev, cfg.transformer, cfg.batch, cfg.seq_len, 99, lengths);
    double first = 0, last = 0;
    for (int s = 0; s < 8; ++s) {
      const StepResult r = step.step(batch);
      ASSERT_TRUE(std::isfinite(r.loss)) << "step " << s;
      EXPECT_FALSE(r.skipped) << "step " << s;
      EXPECT_EQ(r.micro_batches, 2);
      const auto g = test::flat(test::grad_values(step));
      ASSERT_TRUE(test::all_finite(g)) << "step " << s;
      ASSERT_GT(test::squared_norm(g), 0.0) << "step " << s;
      if (s == 0) first = r.loss;
      last = r.loss;
    }
    EXPECT_LT(last, tol::kTrainingLossDropFactor * first) << "first " << first << " last " << last;
    EXPECT_EQ(step.steps_applied(), 8);
  }
}

INSTANTIATE_TEST_SUITE_P(Models, TransformerStep, testing::ValuesIn(test::all_backend_dtypes()), test::param_name);

class TransformerGrad : public testing::TestWithParam<BackendKind> {};

// Sampled elements of every parameter: the step's fp32 gradient against central
// differences of the float64 reference loss.
TEST_P(TransformerGrad, MatchesFloat64FiniteDifferences) {
  HR_TEST_DEVICE(dev, GetParam());
  StepConfig cfg = test::tiny_transformer_config(DType::f32);
  cfg.transformer.layers = 2;
  cfg.seq_len = 8;
  cfg.micro_batch = cfg.batch;  // one micro-batch: the loss is the mean over real tokens
  TrainStep step(dev, cfg);
  const std::vector<int64_t> lengths{8, 5, 8, 3};
  const Batch batch = make_lm_batch(dev, cfg.transformer, cfg.batch, cfg.seq_len, 5, lengths);
  const double loss = step.forward_backward(batch);

  test::RefParams ref = test::master_weights_f64(step.params());
  const test::RefLmBatch rb = test::ref_lm_batch(batch, cfg.batch, cfg.seq_len);
  double count = 0;
  for (int32_t t : rb.targets) count += t != cfg.transformer.ignore_index;
  const double ref_loss = test::ref_transformer_loss(cfg.transformer, ref, rb, count);
  EXPECT_NEAR(loss, ref_loss, tol::kModelLossRel * std::fabs(ref_loss));

  std::mt19937_64 rng(17);
  std::vector<double> got, want;
  for (const Param& p : step.params().all()) {
    const auto g = step.grad(p.name).to_host_f32();
    // Three elements per parameter (the embeddings at used rows, so the
    // difference is not trivially zero).
    for (int k = 0; k < 3; ++k) {
      size_t i = std::uniform_int_distribution<size_t>(0, g.size() - 1)(rng);
      if (p.name == "wte" || p.name == "wpe") {
        const size_t C = static_cast<size_t>(cfg.transformer.d_model);
        const size_t row = static_cast<size_t>(p.name == "wte" ? rb.ids[i % rb.ids.size()] : rb.pos[i % rb.pos.size()]);
        i = row * C + i % C;
      }
      std::vector<double>& x = ref[p.name];
      const double x0 = x[i], h = 1e-6 * std::max(1.0, std::fabs(x0));
      x[i] = x0 + h;
      const double fp = test::ref_transformer_loss(cfg.transformer, ref, rb, count);
      x[i] = x0 - h;
      const double fm = test::ref_transformer_loss(cfg.transformer, ref, rb, count);
      x[i] = x0;
      got.push_back(g[i]);
      want.push_back((fp - fm) / (2 * h));
    }
  }
  std::vector<float> gotf(got.begin(), got.end());
  const double err = rel_l2(gotf, want);
  RecordProperty("grad_rel_l2", fmt::format("{:.3e}", err));
  EXPECT_LE(err, tol::kModelGradFdRelL2) << "relative L2 over " << got.size() << " sampled elements";
  EXPECT_GT(test::squared_norm(gotf), 0.0);
}

INSTANTIATE_TEST_SUITE_P(Models, TransformerGrad, testing::Values(BackendKind::cpu, BackendKind::cuda),
                         test::backend_param_name);

class TransformerCheckpoint : public testing::TestWithParam<BackendKind> {};

// CK-1's mechanism: with dropout, checkpointing every k blocks replays the masks
// from (seed, offset), so every gradient byte equals the run without it; each
// segment's forward runs exactly twice. CK-2's control: a fresh RNG on
// recompute changes the gradients.
TEST_P(TransformerCheckpoint, GradientsBitwiseEqualWithDropout) {
  HR_TEST_DEVICE(dev, GetParam());
  StepConfig cfg = test::tiny_transformer_config(DType::f32);
  cfg.transformer.layers = 4;
  cfg.transformer.dropout = 0.2f;
  const Batch batch = make_lm_batch(dev, cfg.transformer, cfg.batch, cfg.seq_len, 3);
  test::expect_checkpointing_replays_dropout(dev, cfg, batch, 4, {1, 2, 4});
}

INSTANTIATE_TEST_SUITE_P(Models, TransformerCheckpoint, testing::Values(BackendKind::cpu, BackendKind::cuda),
                         test::backend_param_name);

}  // namespace
