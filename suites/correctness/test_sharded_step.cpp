// The sharded step's pieces within one process: the reduce-scatter's counting, the
// pass hooks' order around blocks and recomputes, each model's blocks of parameters
// against the memory model's, the sharded memory model, and what the sharded step
// refuses. DP-3's setting, DP-5 and DP-6 themselves run with every DP property
// (test_data_parallel.cpp at one rank; the mpi-labelled cases at 2 and 4 ranks).
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "harness/check.hpp"
#include "harness/data/synthetic.hpp"
#include "harness/dist/communicator.hpp"
#include "harness/dist/sharded_step.hpp"
#include "harness/step/memory_model.hpp"
#include "harness/step/train_step.hpp"
#include "suites/common/test_support.hpp"

namespace {

TEST(ShardedStep, ReduceScatterOnOneRankCopiesAndCounts) {
  auto comm = hr::dist::make_single_communicator();
  const std::vector<float> send = hr::test::random_nonzero(12, 5);
  std::vector<float> recv(12, 0.f);
  comm->reduce_scatter_sum(send.data(), recv.data(), 12, hr::dist::CommDType::f32);
  EXPECT_EQ(recv, send);  // one rank: its block is the whole, summed over itself
  EXPECT_EQ(comm->stats().calls, 1u);
  EXPECT_EQ(comm->stats().payload_bytes, 48u);  // the input: N x the output
  EXPECT_EQ(comm->stats().bus_bytes, 0.0);
  EXPECT_DOUBLE_EQ(hr::dist::reduce_scatter_bus_factor(4), 0.75);
  std::vector<float> both(24, 1.f);
  EXPECT_THROW(comm->reduce_scatter_sum(both.data(), both.data() + 4, 12, hr::dist::CommDType::f32),
               hr::InvalidArgument);
}

// Records the hooks as "P" / "p" (pass), "F0" / "f0" (block 0's forward), "B1" / "b1".
struct Recorder final : hr::PassHooks {
  std::vector<std::string> events;
  void before_pass(bool backward) override { events.push_back(backward ? "P" : "P-"); }
  void after_pass(bool) override { events.push_back("p"); }
  void before_block_forward(int64_t b) override { events.push_back("F" + std::to_string(b)); }
  void after_block_forward(int64_t b) override { events.push_back("f" + std::to_string(b)); }
  void before_block_backward(int64_t b) override { events.push_back("B" + std::to_string(b)); }
  void after_block_backward(int64_t b) override { events.push_back("b" + std::to_string(b)); }
};

hr::StepConfig small_transformer(int64_t checkpoint_every) {
  hr::StepConfig c = hr::step_config_for(hr::ModelKind::transformer, hr::Preset::quick);
  c.transformer.layers = 2;
  c.transformer.dropout = 0.f;
  c.batch = c.micro_batch = 2;
  c.seq_len = 16;
  c.checkpoint.every_k_blocks = checkpoint_every;
  return c;
}

TEST(PassHooks, AroundEveryBlockAndEveryRecompute) {
  HR_TEST_DEVICE(dev, hr::BackendKind::cpu);
  for (int64_t k : {0, 1}) {
    SCOPED_TRACE(k);
    const hr::StepConfig cfg = small_transformer(k);
    hr::TrainStep step(dev, cfg);
    Recorder rec;
    step.set_pass_hooks(&rec);
    const hr::Batch batch = hr::make_lm_batch(dev, cfg.transformer, cfg.batch, cfg.seq_len, 3);
    (void)step.forward_backward(batch);
    const std::vector<std::string> plain = {"P", "F0", "f0", "F1", "f1", "B1", "b1", "B0", "b0", "p"};
    const std::vector<std::string> checkpointed = {"P",  "F0", "f0", "F1", "f1", "F1", "f1",
                                                   "B1", "b1", "F0", "f0", "B0", "b0", "p"};
    EXPECT_EQ(rec.events, k == 0 ? plain : checkpointed);
    rec.events.clear();
    (void)step.loss(batch);
    EXPECT_EQ(rec.events, (std::vector<std::string>{"P-", "F0", "f0", "F1", "f1", "p"}));
  }
}

// Two code paths: the built model's own block indices, and the memory model's
// layout of the configuration's tensors.
TEST(ShardedStep, EachModelsBlocksMatchTheMemoryModel) {
  HR_TEST_DEVICE(dev, hr::BackendKind::cpu);
  for (hr::ModelKind kind : {hr::ModelKind::mlp, hr::ModelKind::transformer}) {
    for (bool lora : {false, true}) {
      hr::StepConfig cfg = hr::step_config_for(kind, hr::Preset::quick);
      if (kind == hr::ModelKind::mlp) cfg.mlp.norm = hr::NormKind::layernorm;
      if (lora) cfg.adapters.kind = hr::AdapterKind::lora;
      SCOPED_TRACE(hr::summary(cfg));
      hr::TrainStep step(dev, cfg);
      const std::vector<int64_t> built = step.model().param_blocks();
      EXPECT_EQ(built, hr::parameter_tensor_blocks(cfg));
      int64_t inside = 0;
      for (int64_t b : built) inside += b >= 0;
      EXPECT_GT(inside, 0);
      EXPECT_LT(inside, static_cast<int64_t>(built.size()));  // the head (and embeddings) are outside
    }
  }
}

TEST(ShardedStep, MemoryModelShardsEachUnitAndCountsTheSchedule) {
  hr::StepConfig cfg = hr::step_config_for(hr::ModelKind::transformer, hr::Preset::quick);
  cfg.transformer.layers = 3;
  cfg.batch = 16;
  cfg.micro_batch = 2;  // K = 2 per rank at N = 4
  cfg.optimizer = hr::OptimizerConfig{};
  const int64_t P = hr::parameter_count(cfg);
  for (hr::Sharding level : {hr::Sharding::zero1, hr::Sharding::zero2, hr::Sharding::zero3}) {
    cfg.sharding = level;
    const hr::ShardedPrediction p = hr::predict_sharded(cfg, 4);
    SCOPED_TRACE(hr::sharding_name(level));
    EXPECT_EQ(p.parameters, P);
    EXPECT_GE(p.padded, P);
    EXPECT_LT(p.padded - P, 4 * 4);  // under N elements of padding per unit, 4 units
    EXPECT_EQ(p.padded, 4 * p.shard);
    EXPECT_EQ(p.micro_batches, 2);
    EXPECT_EQ(p.optimizer_state, static_cast<size_t>(p.shard) * 8);
    if (level == hr::Sharding::zero3) {
      EXPECT_EQ(p.weights, static_cast<size_t>(p.shard) * 4);
      EXPECT_GT(p.weights_peak, p.weights);
      // K x (the outside unit once, every block twice) gathered, K reduce-scatters.
      EXPECT_DOUBLE_EQ(p.parameter_elements, 2.0 * (p.outside_padded + 2.0 * (p.padded - p.outside_padded)));
      EXPECT_DOUBLE_EQ(p.gradient_elements, 2.0 * p.padded);
    } else {
      EXPECT_EQ(p.weights, static_cast<size_t>(p.padded) * 4);
      EXPECT_DOUBLE_EQ(p.parameter_elements, static_cast<double>(p.padded));
    }
  }
  cfg.sharding = hr::Sharding::none;
  EXPECT_THROW(hr::predict_sharded(cfg, 4), hr::InvalidArgument);
  cfg.sharding = hr::Sharding::zero2;
  EXPECT_THROW(hr::predict_sharded(cfg, 3), hr::InvalidArgument);  // 16 rows over 3 ranks
}

TEST(ShardedStep, RefusesWhatItDoesNotRun) {
  HR_TEST_DEVICE(dev, hr::BackendKind::cpu);
  auto comm = hr::dist::make_single_communicator();
  hr::StepConfig cfg = small_transformer(0);
  cfg.optimizer = hr::OptimizerConfig{};
  cfg.sharding = hr::Sharding::zero2;
  {
    hr::StepConfig c = cfg;
    c.sharding = hr::Sharding::none;
    EXPECT_THROW(hr::dist::ShardedStep(dev, *comm, c), hr::InvalidArgument);
  }
  {
    hr::StepConfig c = cfg;
    c.precision.compute = hr::DType::f16;
    EXPECT_THROW(hr::dist::ShardedStep(dev, *comm, c), hr::InvalidArgument);
    EXPECT_THROW(hr::predict_sharded(c, 2), hr::InvalidArgument);  // nothing predicted for a step that cannot run
  }
  {
    hr::StepConfig c = cfg;
    c.precision.compute = hr::DType::bf16;
    c.precision.master_weights = false;
    EXPECT_THROW(hr::dist::ShardedStep(dev, *comm, c), hr::InvalidArgument);
    EXPECT_THROW(hr::predict_sharded(c, 2), hr::InvalidArgument);
  }
  {
    hr::StepConfig c = cfg;
    c.adapters.kind = hr::AdapterKind::lora;
    EXPECT_THROW(hr::dist::ShardedStep(dev, *comm, c), hr::InvalidArgument);
  }
  {
    hr::StepConfig c = cfg;
    c.optimizer.kind = hr::OptimizerKind::adamw8bit;
    EXPECT_THROW(hr::dist::ShardedStep(dev, *comm, c), hr::InvalidArgument);
  }
  EXPECT_THROW(hr::dist::ShardedStep(dev, *comm, cfg, hr::dist::ShardFault::gather_reuses_previous),
               hr::InvalidArgument);  // a zero3 fault
  // One process runs the unsharded step only, and says where the sharded one is.
  try {
    hr::TrainStep step(dev, cfg);
    ADD_FAILURE() << "a TrainStep with sharding zero2 was built";
  } catch (const hr::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("sharding"), std::string::npos) << e.what();
  }
}

// At one rank each level's step runs the single-process step's arithmetic on the
// same micro-batches: the parameters agree with a TrainStep of K = 2 and window
// normalisation to rounding, and zero3 holds only its (whole) shard between steps.
TEST(ShardedStep, OneRankFollowsTheSingleProcessStep) {
  HR_TEST_DEVICE(dev, hr::BackendKind::cpu);
  auto comm = hr::dist::make_single_communicator();
  hr::StepConfig cfg = small_transformer(0);
  cfg.batch = 4;
  cfg.micro_batch = 2;
  cfg.optimizer = hr::OptimizerConfig{};
  cfg.optimizer.kind = hr::OptimizerKind::sgd;  // linear in the gradient: rounding stays rounding
  cfg.optimizer.sgd.lr = 0.1f;
  cfg.optimizer.sgd.momentum = 0.9f;
  cfg.loss_norm = hr::LossNormalization::sum_div_window_items;
  hr::TrainStep ref(dev, cfg);
  const hr::Batch batch = hr::make_lm_batch(dev, cfg.transformer, cfg.batch, cfg.seq_len, 11);
  for (int s = 0; s < 3; ++s) ref.step(batch);
  for (hr::Sharding level : {hr::Sharding::zero1, hr::Sharding::zero2, hr::Sharding::zero3}) {
    SCOPED_TRACE(hr::sharding_name(level));
    hr::StepConfig c = cfg;
    c.sharding = level;
    hr::dist::ShardedStep step(dev, *comm, c);
    for (int s = 0; s < 3; ++s) step.step(batch);
    const auto got = step.parameters();
    size_t i = 0;
    double worst = 0;
    for (const hr::Param& p : ref.params().all()) {
      ASSERT_LT(i, got.size());
      ASSERT_EQ(got[i].first, p.name);
      const std::vector<float> want = p.master.to_host_f32();
      ASSERT_EQ(got[i].second.size(), want.size());
      for (size_t k = 0; k < want.size(); ++k)
        worst = std::max(worst, static_cast<double>(std::fabs(got[i].second[k] - want[k])));
      ++i;
    }
    EXPECT_LT(worst, 1e-5) << "largest parameter difference after 3 steps";
  }
}

}  // namespace
