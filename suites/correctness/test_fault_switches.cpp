// The fault switches' gate (harness/faults.hpp) and the sparse-batch count
// (harness/step/train_step.hpp): disarmed, every switch reads as off, in this process
// and in the ones it starts; a language-model micro-batch with fewer real targets
// than kMinRealTargets is counted.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "harness/data/packing.hpp"
#include "harness/data/synthetic.hpp"
#include "harness/dist/dp_step.hpp"
#include "harness/faults.hpp"
#include "harness/properties/packing.hpp"
#include "harness/step/train_step.hpp"
#include "suites/common/test_support.hpp"

namespace {

TEST(FaultSwitches, DisarmedEverySwitchReadsAsOff) {
  ASSERT_TRUE(hr::faults::armed());
  EXPECT_EQ(hr::faults::armed(hr::dist::ZeroFault::whole_state), hr::dist::ZeroFault::whole_state);
  EXPECT_EQ(hr::faults::armed(std::string("ln_f.bias")), "ln_f.bias");
  {
    hr::faults::Disarmed off;
    EXPECT_FALSE(hr::faults::armed());
    EXPECT_EQ(hr::faults::armed(hr::dist::ZeroFault::whole_state), hr::dist::ZeroFault::none);
    EXPECT_EQ(hr::faults::armed(std::string("ln_f.bias")), "");
    EXPECT_EQ(hr::faults::armed(4), 0);
    // Processes started now (the data-parallel ranks) are disarmed too.
    const char* env = std::getenv(hr::faults::kDisarmEnv);
    ASSERT_NE(env, nullptr);
    EXPECT_STREQ(env, "1");
  }
  EXPECT_TRUE(hr::faults::armed());
  EXPECT_EQ(std::getenv(hr::faults::kDisarmEnv), nullptr);
}

TEST(FaultSwitches, AStepBuiltDisarmedRunsWithoutItsFaults) {
  HR_TEST_DEVICE(dev, hr::BackendKind::cpu);
  hr::StepConfig cfg = hr::props::pk_config(hr::DType::bf16, false);
  cfg.precision.fault_compute_fp16 = true;
  cfg.precision.scaler.fault_fixed_scale = 4.0;
  cfg.loss_norm = hr::LossNormalization::mean_div_k_plus_one;
  cfg.checkpoint.fault_never_recompute = true;
  cfg.checkpoint.fault_grad_ulp_elements = 1;
  cfg.fault_step_count_frozen = true;
  cfg.fault_unscale_into_fp16 = true;
  {
    hr::TrainStep armed(dev, cfg);
    EXPECT_EQ(armed.config().precision.compute, hr::DType::f16);
    EXPECT_EQ(armed.scaler().scale(), 4.0);
    EXPECT_EQ(armed.config().loss_norm, hr::LossNormalization::mean_div_k_plus_one);
  }
  hr::faults::Disarmed off;
  hr::TrainStep step(dev, cfg);
  EXPECT_EQ(step.config().precision.compute, hr::DType::bf16);
  EXPECT_EQ(step.config().precision.scaler.fault_fixed_scale, 0.0);
  EXPECT_EQ(step.config().loss_norm, hr::LossNormalization::mean_div_k);
  EXPECT_FALSE(step.config().checkpoint.fault_never_recompute);
  EXPECT_EQ(step.config().checkpoint.fault_grad_ulp_elements, 0);
  EXPECT_FALSE(step.config().fault_step_count_frozen);
  EXPECT_FALSE(step.config().fault_unscale_into_fp16);
}

TEST(SparseMicroBatches, ALanguageModelMicroBatchWithFewTargetsIsCounted) {
  HR_TEST_DEVICE(dev, hr::BackendKind::cpu);
  hr::StepConfig cfg = hr::props::pk_config(hr::DType::f32, false);
  auto run = [&](int64_t length) {
    const auto seqs = hr::make_lm_sequences(cfg.transformer, {length}, 7);
    const hr::Batch b = hr::make_padded_batch(dev, cfg.transformer, seqs, cfg.seq_len);
    hr::TrainStep step(dev, cfg);
    const int64_t before = hr::sparse_micro_batches();
    step.forward_backward(b);
    return hr::sparse_micro_batches() - before;
  };
  EXPECT_EQ(run(hr::kMinRealTargets), 1);      // length L holds L - 1 targets
  EXPECT_EQ(run(hr::kMinRealTargets + 1), 0);  // kMinRealTargets targets
  EXPECT_EQ(run(cfg.seq_len), 0);
}

}  // namespace
