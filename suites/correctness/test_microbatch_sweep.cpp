// BM-MB's sweep points (harness/properties/microbatch_sweep.hpp) carry what the
// report's throughput / bytes against micro-batch curve reads. Structure and
// memory only: timings are asserted nowhere, they are measured in benchmarks.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "harness/models/presets.hpp"
#include "kernels/attention/attention.hpp"
#include "harness/properties/microbatch_sweep.hpp"
#include "harness/registry.hpp"
#include "harness/results/results.hpp"
#include "harness/step/train_step.hpp"
#include "suites/common/step_support.hpp"
#include "suites/common/test_support.hpp"

namespace {

class MicroBatchSweep : public testing::TestWithParam<hr::BackendKind> {};

TEST_P(MicroBatchSweep, PointsCarryConfigTimeAndBytesPerConsumer) {
  HR_TEST_DEVICE(dev, GetParam());
  const auto sweep = hr::props::microbatch_sweep_smoke_config();
  const auto points = hr::props::run_microbatch_sweep(dev, sweep, 1234);
  ASSERT_EQ(points.size(), sweep.micro_batches.size());
  for (const hr::SweepPoint& p : points) {
    EXPECT_EQ(p.sweep, "BM-MB");
    ASSERT_EQ(p.status, "ok") << p.reason;
    ASSERT_TRUE(p.time.has_value());
    EXPECT_GT(p.time->reps, 0);
    const int64_t mb = p.config["micro_batch"].get<int64_t>();
    EXPECT_EQ(p.config["accum_steps"].get<int64_t>() * mb, sweep.base.batch);
    EXPECT_GT(p.metrics["tokens_per_s"].get<double>(), 0.0);
    EXPECT_GT(p.memory.peak(hr::Consumer::weights), 0u);
    EXPECT_GT(p.memory.peak(hr::Consumer::gradients), 0u);
    EXPECT_GT(p.memory.peak(hr::Consumer::optimizer_state), 0u);
    EXPECT_GT(p.memory.peak(hr::Consumer::activations), 0u);
    if (mb == sweep.micro_batches.front()) EXPECT_EQ(p.metrics["relative_per_sample_throughput"].get<double>(), 1.0);
    // A step runs attention forward and backward once per layer and micro-batch, on
    // one form: naive where the model asks for it, else the CPU loop or one of the
    // GPU's kernels (the setting's, for 16-bit inputs).
    const bool mem_eff = sweep.base.transformer.memory_efficient_attention;
    const std::set<std::string> variants = hr::attention_variants(p);
    ASSERT_EQ(variants.size(), 1u);
    const std::string form = *variants.begin();
    if (!mem_eff || !dev.is_cuda()) EXPECT_EQ(form, !mem_eff ? "naive" : "cpu");
    const double per_step = static_cast<double>(sweep.base.transformer.layers * p.config["accum_steps"].get<int64_t>());
    EXPECT_EQ(p.time->kernel_calls, (std::map<std::string, double>{{"attention_backward:" + form, per_step},
                                                                   {"attention_forward:" + form, per_step}}));
  }
  // Weights, gradients and optimizer state do not depend on the micro-batch;
  // activations shrink with it (the point of accumulation).
  const hr::SweepPoint& big = points.front();
  const hr::SweepPoint& small = points.back();
  EXPECT_EQ(big.memory.peak(hr::Consumer::weights), small.memory.peak(hr::Consumer::weights));
  EXPECT_EQ(big.memory.peak(hr::Consumer::gradients), small.memory.peak(hr::Consumer::gradients));
  EXPECT_EQ(big.memory.peak(hr::Consumer::optimizer_state), small.memory.peak(hr::Consumer::optimizer_state));
  EXPECT_LT(small.memory.peak(hr::Consumer::activations), big.memory.peak(hr::Consumer::activations));
  // The host waits as often in a step of many micro-batches as in one of a few
  // (test_step_syncs.cpp holds the step to it; here the sweep records it). On a GPU
  // a read-back counts as a wait only when it has not landed, so the window's loss
  // read may count in one step and not in another: one wait per step either way.
  const double slack = dev.is_cuda() ? 1.0 : 0.0;
  for (const hr::SweepPoint& p : points)
    EXPECT_NEAR(p.metrics["host_syncs_per_step"].get<double>(), big.metrics["host_syncs_per_step"].get<double>(),
                slack);
  EXPECT_LE(big.metrics["host_syncs_per_step"].get<double>(), 2.0);
}

// Out of memory is a status with its reason, not an exception out of the sweep.
TEST_P(MicroBatchSweep, BudgetTooSmallGivesOutOfMemoryPoints) {
  HR_TEST_DEVICE(dev, GetParam());
  const auto sweep = hr::props::microbatch_sweep_smoke_config();
  const auto budget = dev.memory().budget();
  dev.memory().set_budget(dev.memory().snapshot().total_current_bytes + 1024);
  const auto points = hr::props::run_microbatch_sweep(dev, sweep, 1234);
  dev.memory().set_budget(budget);
  ASSERT_EQ(points.size(), sweep.micro_batches.size());
  for (const hr::SweepPoint& p : points) {
    EXPECT_EQ(p.status, "out_of_memory");
    EXPECT_FALSE(p.reason.empty());
    EXPECT_FALSE(p.time.has_value());
  }
}

// The attention forms BM-MB times: naive alone on the CPU and in fp32; on a GPU in
// 16 bits also the memory-efficient form on the run's kernels, and on cuDNN's where
// the device has them and the run did not choose them already.
TEST(MicroBatchSweepForms, NaiveEverywhereAndMemoryEfficientOnAGpuIn16Bits) {
  using hr::props::MicroBatchAttention;
  using K = hr::ops::GpuAttentionKernel;
  using Forms = std::vector<MicroBatchAttention>;
  const MicroBatchAttention naive{};
  EXPECT_EQ(hr::props::microbatch_attention_forms(hr::BackendKind::cpu, hr::DType::f32, K::tensor_core, true),
            Forms{naive});
  EXPECT_EQ(hr::props::microbatch_attention_forms(hr::BackendKind::cpu, hr::DType::bf16, K::cudnn, true),
            Forms{naive});
  EXPECT_EQ(hr::props::microbatch_attention_forms(hr::BackendKind::cuda, hr::DType::f32, K::tensor_core, true),
            Forms{naive});
  EXPECT_EQ(hr::props::microbatch_attention_forms(hr::BackendKind::cuda, hr::DType::bf16, K::tensor_core, true),
            (Forms{naive, {true, K::tensor_core}, {true, K::cudnn}}));
  EXPECT_EQ(hr::props::microbatch_attention_forms(hr::BackendKind::cuda, hr::DType::f16, K::tensor_core, false),
            (Forms{naive, {true, K::tensor_core}}));
  EXPECT_EQ(hr::props::microbatch_attention_forms(hr::BackendKind::cuda, hr::DType::bf16, K::cudnn, true),
            (Forms{naive, {true, K::cudnn}}));
  EXPECT_EQ(hr::props::microbatch_attention_forms(hr::BackendKind::cuda, hr::DType::bf16, K::scalar, false),
            (Forms{naive, {true, K::scalar}}));
  // The device form: a CPU device times naive attention alone.
  auto dev = hr::make_device("cpu");
  const auto sweep = hr::props::microbatch_sweep_config(hr::Preset::quick, hr::BackendKind::cpu);
  EXPECT_EQ(hr::props::microbatch_attention_forms(*dev, sweep.base), Forms{naive});
}

// On a GPU, the sweep runs each form at every micro-batch: a memory-efficient point
// names its kernels in its config, ran them (its kernel calls), and is set against
// its own form's largest micro-batch; the run's setting is back after the sweep.
TEST(MicroBatchSweepForms, cuda_MemoryEfficientPointsNameAndRunTheirKernels) {
  HR_TEST_DEVICE(dev, hr::BackendKind::cuda);
  auto sweep = hr::props::microbatch_sweep_smoke_config();
  sweep.base.precision.compute = hr::DType::bf16;
  sweep.base.transformer.d_model = 64;  // head dim 32, which every GPU form takes
  sweep.base.transformer.heads = 2;
  sweep.attention = hr::props::microbatch_attention_forms(dev, sweep.base);
  ASSERT_GE(sweep.attention.size(), 2u);
  const hr::ops::GpuAttentionKernel before = hr::ops::gpu_attention_kernel();
  const bool was_default = hr::ops::gpu_attention_kernel_is_default();
  const auto points = hr::props::run_microbatch_sweep(dev, sweep, 1234);
  EXPECT_EQ(hr::ops::gpu_attention_kernel(), before);
  EXPECT_EQ(hr::ops::gpu_attention_kernel_is_default(), was_default);
  ASSERT_EQ(points.size(), sweep.attention.size() * sweep.micro_batches.size());
  std::set<std::string> kernels;
  for (size_t i = 0; i < points.size(); ++i) {
    const hr::SweepPoint& p = points[i];
    const hr::props::MicroBatchAttention& form = sweep.attention[i / sweep.micro_batches.size()];
    ASSERT_EQ(p.status, "ok") << p.reason;
    EXPECT_EQ(p.config["attention"], form.memory_efficient ? "memory_efficient" : "naive");
    const std::set<std::string> ran = hr::attention_variants(p);
    ASSERT_EQ(ran.size(), 1u) << p.config.dump();
    if (!form.kernel) {
      EXPECT_FALSE(p.config.contains("attention_kernel"));
      EXPECT_EQ(*ran.begin(), "naive");
    } else {
      const std::string name = hr::ops::gpu_attention_kernel_name(*form.kernel);
      EXPECT_EQ(p.config["attention_kernel"], name);
      EXPECT_EQ(*ran.begin(), name) << "the point names kernels it did not run";
      kernels.insert(name);
    }
    if (p.config["micro_batch"] == sweep.micro_batches.front())
      EXPECT_EQ(p.metrics["relative_per_sample_throughput"].get<double>(), 1.0);
  }
  EXPECT_EQ(kernels.size(), sweep.attention.size() - 1);  // each memory-efficient form its own kernels
}

// On a GPU, validate re-measures a memory-efficient point on the kernels it names:
// the same configuration, and those kernels ran (not the run's setting).
TEST(MicroBatchSweepForms, cuda_RemeasuresAMemoryEfficientPointOnItsKernels) {
  HR_TEST_DEVICE(dev, hr::BackendKind::cuda);
  const auto& sweeps = hr::sweep_registry();
  const auto spec = std::find_if(sweeps.begin(), sweeps.end(), [](const hr::SweepSpec& s) { return s.id == "BM-MB"; });
  ASSERT_NE(spec, sweeps.end());
  hr::RunContext ctx{dev, hr::Preset::quick, 1234, {}};
  const auto sweep = hr::props::microbatch_sweep_config(hr::Preset::quick, hr::BackendKind::cuda);
  hr::TimingOptions once;
  once.warmup = 0;
  once.min_reps = once.max_reps = 1;
  int remeasured = 0;
  for (const hr::props::MicroBatchAttention& form : hr::props::microbatch_attention_forms(dev, sweep.base)) {
    if (!form.kernel) continue;
    const std::string name = hr::ops::gpu_attention_kernel_name(*form.kernel);
    SCOPED_TRACE(name);
    hr::StepConfig cfg = sweep.base;
    cfg.micro_batch = sweep.micro_batches.front();
    cfg.transformer.memory_efficient_attention = true;
    const hr::SweepPoint recorded = hr::props::measure_microbatch_point(dev, cfg, 1234, once, form.kernel);
    ASSERT_EQ(recorded.status, "ok") << recorded.reason;
    const auto again = spec->remeasure(ctx, recorded);
    ASSERT_TRUE(again.has_value());
    EXPECT_EQ(again->config, recorded.config);
    EXPECT_EQ(hr::attention_variants(*again), std::set<std::string>{name});
    ++remeasured;
  }
  EXPECT_GE(remeasured, 1);
}

// A recorded point of a form this device does not time is not re-measured: a GPU's
// memory-efficient point on a CPU, or one naming kernels that do not exist.
TEST(MicroBatchSweepForms, RemeasuresOnlyTheFormsThisDeviceTimes) {
  auto dev = hr::make_device("cpu");
  hr::RunContext ctx{*dev, hr::Preset::quick, 1234, {}};
  const auto& sweeps = hr::sweep_registry();
  const auto spec = std::find_if(sweeps.begin(), sweeps.end(), [](const hr::SweepSpec& s) { return s.id == "BM-MB"; });
  ASSERT_NE(spec, sweeps.end());
  const auto sweep = hr::props::microbatch_sweep_config(hr::Preset::quick, hr::BackendKind::cpu);
  hr::StepConfig cfg = sweep.base;
  cfg.micro_batch = 32;
  hr::TimingOptions once;
  once.warmup = 0;
  once.min_reps = once.max_reps = 1;
  const hr::SweepPoint naive = hr::props::measure_microbatch_point(*dev, cfg, 1234, once);
  ASSERT_EQ(naive.status, "ok") << naive.reason;
  hr::SweepPoint fused = naive;
  fused.config["attention"] = "memory_efficient";
  fused.config["attention_kernel"] = "cudnn";
  EXPECT_FALSE(spec->remeasure(ctx, fused).has_value());
  fused.config["attention_kernel"] = "warp_specialised";
  EXPECT_FALSE(spec->remeasure(ctx, fused).has_value());
  fused.config.erase("attention_kernel");  // the CPU's memory-efficient loop is not a BM-MB form
  EXPECT_FALSE(spec->remeasure(ctx, fused).has_value());
}

TEST(MicroBatchSweepRegistry, RegisteredAsBmMb) {
  const auto& sweeps = hr::sweep_registry();
  EXPECT_EQ(std::count_if(sweeps.begin(), sweeps.end(), [](const hr::SweepSpec& s) { return s.id == "BM-MB"; }), 1);
}

// validate re-measures a point judged slower through the registered hook: the same
// configuration, timed again with the preset's repetitions (and, on the CPU, the
// CPU time and the reference work beside each); nothing for a point of another
// preset or sweep.
TEST(MicroBatchSweepRegistry, RemeasuresOneRecordedPoint) {
  auto dev = hr::make_device("cpu");
  const auto& sweeps = hr::sweep_registry();
  const auto spec = std::find_if(sweeps.begin(), sweeps.end(), [](const hr::SweepSpec& s) { return s.id == "BM-MB"; });
  ASSERT_NE(spec, sweeps.end());
  ASSERT_TRUE(spec->remeasure);
  hr::RunContext ctx{*dev, hr::Preset::quick, 1234, {}};
  const auto sweep = hr::props::microbatch_sweep_config(hr::Preset::quick, hr::BackendKind::cpu);
  hr::StepConfig cfg = sweep.base;
  cfg.micro_batch = 16;
  hr::TimingOptions once;
  once.warmup = 0;
  once.min_reps = once.max_reps = 1;
  const hr::SweepPoint recorded = hr::props::measure_microbatch_point(*dev, cfg, 1234, once);
  const auto again = spec->remeasure(ctx, recorded);
  ASSERT_TRUE(again.has_value());
  EXPECT_EQ(again->config, recorded.config);
  EXPECT_EQ(again->status, "ok") << again->reason;
  ASSERT_TRUE(again->time.has_value());
  EXPECT_GE(again->time->reps, sweep.timing.min_reps);  // the preset's repetitions, not the recorded point's
  EXPECT_LE(again->time->reps, sweep.timing.max_reps);
  EXPECT_EQ(again->time->cpu_samples_s.size(), again->time->samples_s.size());
  EXPECT_EQ(again->time->ref_cpu_samples_s.size(), again->time->samples_s.size());
  EXPECT_EQ(again->metrics["blas_threads"], 1);
  hr::SweepPoint other = recorded;
  other.config["d_model"] = 999;
  EXPECT_FALSE(spec->remeasure(ctx, other).has_value());
  other = recorded;
  other.config["micro_batch"] = 3;
  EXPECT_FALSE(spec->remeasure(ctx, other).has_value());
}

INSTANTIATE_TEST_SUITE_P(, MicroBatchSweep, testing::Values(hr::BackendKind::cpu, hr::BackendKind::cuda),
                         hr::test::backend_param_name);

}  // namespace

namespace {

// BM-MB's model FLOPs per token against the model's own parameters: 6 per element
// of every 2-D weight but the two embeddings, plus attention's 12 x layers x seq x
// d_model; the full preset's 1.258 GFLOP (d_model 1024, 12 layers, vocab 32768,
// seq 1024) by hand: 6 x 184.5M + 151.0M.
TEST(MicroBatchSweepFlops, ModelFlopsPerTokenCountTheModelsMatrices) {
  HR_TEST_DEVICE(dev, hr::BackendKind::cpu);
  hr::StepConfig cfg = hr::test::tiny_transformer_config(hr::DType::f32);
  cfg.transformer.layers = 3;
  cfg.transformer.mlp_ratio = 3;
  hr::TrainStep step(dev, cfg);
  double matrix = 0;
  for (const hr::Param& p : step.params().all())
    if (p.master.ndim() == 2 && p.name != "wte" && p.name != "wpe") matrix += static_cast<double>(p.master.numel());
  const double want = 6 * matrix + 12.0 * 3 * static_cast<double>(cfg.seq_len * cfg.transformer.d_model);
  EXPECT_DOUBLE_EQ(hr::model_flops_per_token(cfg.transformer, cfg.seq_len), want);

  hr::TransformerConfig full;
  full.vocab = 32768;
  full.d_model = 1024;
  full.heads = 16;
  full.layers = 12;
  full.mlp_ratio = 4;
  EXPECT_NEAR(hr::model_flops_per_token(full, 1024), 1.258e9, 0.5e6);
}

}  // namespace
