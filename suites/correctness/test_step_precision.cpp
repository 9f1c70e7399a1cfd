// The step's precision policy and loss normalisation, as mechanisms: 16-bit
// modes keep fp32 masters and fp32 gradients with 16-bit compute copies; the
// fp16 loss scaler skips a step with a non-finite gradient leaving parameters
// and optimizer state bitwise untouched, backs off, and grows after its
// interval; micro-batch losses divided by K (or by the window's real tokens)
// give the full-batch gradient and the undivided variant K times it.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "harness/data/synthetic.hpp"
#include "harness/step/train_step.hpp"
#include "kernels/common/float16.hpp"
#include "kernels/elementwise/elementwise.hpp"
#include "kernels/reduce/reduce.hpp"
#include "suites/common/step_support.hpp"
#include "suites/common/test_support.hpp"
#include "harness/tolerances.hpp"

namespace {

using namespace hr;

std::vector<uint8_t> all_state_bytes(TrainStep& s) {
  std::vector<uint8_t> out;
  for (const Param& p : s.params().all()) {
    const auto b = p.master.to_host_bytes();
    out.insert(out.end(), b.begin(), b.end());
  }
  for (const auto& [n, t] : s.optimizer().state()) {
    const auto b = t.to_host_bytes();
    out.insert(out.end(), b.begin(), b.end());
  }
  return out;
}

class StepPrecision : public testing::TestWithParam<test::BackendDType> {};

TEST_P(StepPrecision, MastersAndGradientsAreFp32WithCompute16BitCopies) {
  HR_TEST_DEVICE(dev, GetParam().backend);
  const DType dt = GetParam().dtype;
  TrainStep step(dev, test::tiny_transformer_config(dt));
  for (const Param& p : step.params().all()) {
    EXPECT_EQ(p.master.dtype(), DType::f32) << p.name;
    EXPECT_EQ(p.grad.dtype(), DType::f32) << p.name;
    EXPECT_EQ(p.compute.dtype(), dt) << p.name;
    EXPECT_EQ(p.master.consumer(), Consumer::weights);
    EXPECT_EQ(p.grad.consumer(), Consumer::gradients);
    if (dt != DType::f32) {
      const auto m = p.master.to_host_f32(), c = p.compute.to_host_f32();
      for (size_t i = 0; i < m.size(); ++i)
        ASSERT_EQ(c[i], dt == DType::f16 ? round_to<half_t>(m[i]) : round_to<bfloat16_t>(m[i])) << p.name;
    }
  }
  for (const auto& [n, t] : step.optimizer().state()) EXPECT_EQ(t.consumer(), Consumer::optimizer_state) << n;
}

// MP-4's control configuration: without master weights the parameters live in
// the 16-bit dtype only (one copy, updated in place) and the step still runs.
class StepNoMaster : public testing::TestWithParam<test::BackendDType> {};

TEST_P(StepNoMaster, ParametersLiveIn16Bit) {
  HR_TEST_DEVICE(dev, GetParam().backend);
  const DType dt = GetParam().dtype;
  StepConfig cfg = test::tiny_mlp_config(dt);
  cfg.precision.master_weights = false;
  const size_t before = dev.memory().snapshot().current(Consumer::weights);
  TrainStep step(dev, cfg);
  EXPECT_EQ(dev.memory().snapshot().current(Consumer::weights) - before,
            static_cast<size_t>(step.params().numel()) * 2);
  for (const Param& p : step.params().all()) {
    EXPECT_EQ(p.master.dtype(), dt);
    EXPECT_EQ(p.master.data(), p.compute.data());
  }
  const auto w0 = step.params().at("layers.0.weight").master.to_host_bytes();
  EXPECT_FALSE(step.step(make_mlp_batch(dev, cfg.mlp, cfg.batch, 1)).skipped);
  EXPECT_GT(bitwise_mismatches(w0, step.params().at("layers.0.weight").master.to_host_bytes()), 0u);
}

INSTANTIATE_TEST_SUITE_P(Step, StepPrecision, testing::ValuesIn(test::all_backend_dtypes()), test::param_name);

std::vector<test::BackendDType> sixteen_bit() {
  std::vector<test::BackendDType> v;
  for (const auto& p : test::all_backend_dtypes())
    if (p.dtype != DType::f32) v.push_back(p);
  return v;
}
INSTANTIATE_TEST_SUITE_P(Step, StepNoMaster, testing::ValuesIn(sixteen_bit()), test::param_name);

class StepScaler : public testing::TestWithParam<BackendKind> {};

TEST_P(StepScaler, OverflowInAnyMicroBatchSkipsTheWholeStep) {
  HR_TEST_DEVICE(dev, GetParam());
  StepConfig cfg = test::tiny_transformer_config(DType::f16);
  cfg.precision.scaler.growth_interval = 2;
  TrainStep step(dev, cfg);
  const Batch batch = make_lm_batch(dev, cfg.transformer, cfg.batch, cfg.seq_len, 1);
  ASSERT_FALSE(step.step(batch).skipped);  // optimizer state now non-zero
  const double scale0 = step.scaler().scale();
  for (const char* name : {"wte", "h.1.mlp.fc.weight", "lm_head.weight"}) {
    SCOPED_TRACE(name);
    const auto before = all_state_bytes(step);
    const int64_t applied = step.steps_applied();
    step.zero_grad();
    step.accumulate(batch);
    // An inf in one gradient element, as an overflowing micro-batch leaves it.
    Tensor g = step.grad(name);
    std::vector<float> v = g.to_host_f32();
    v[v.size() / 2] = std::numeric_limits<float>::infinity();
    g.copy_from(Tensor::from_host(dev, v, g.shape(), DType::f32, Consumer::workspace));
    const StepResult r = step.apply();
    EXPECT_TRUE(r.skipped);
    EXPECT_TRUE(r.found_nonfinite);
    EXPECT_EQ(step.steps_applied(), applied);
    EXPECT_EQ(bitwise_mismatches(before, all_state_bytes(step)), 0u);
    EXPECT_EQ(step.scaler().growth_tracker(), 0);
  }
  EXPECT_EQ(step.scaler().scale(), scale0 * 0.125);
  // Two clean steps: the scale grows by 2.
  const double s1 = step.scaler().scale();
  EXPECT_FALSE(step.step(batch).skipped);
  EXPECT_EQ(step.scaler().scale(), s1);
  EXPECT_FALSE(step.step(batch).skipped);
  EXPECT_EQ(step.scaler().scale(), 2 * s1);
}

// A micro-batch that overflows fp16 for real (its loss times 2^24: the logits'
// gradient exceeds 65504 at scale 2^16 and is stored as inf), not an inf written
// into a gradient: the whole step is skipped with everything untouched, the scale
// halves, and the same multiplier in fp32 stays finite.
TEST_P(StepScaler, RealOverflowInOneMicroBatchSkipsTheStep) {
  HR_TEST_DEVICE(dev, GetParam());
  StepConfig cfg = test::tiny_transformer_config(DType::f16);
  TrainStep step(dev, cfg);
  const Batch batch = make_lm_batch(dev, cfg.transformer, cfg.batch, cfg.seq_len, 3);
  ASSERT_FALSE(step.step(batch).skipped);
  const auto before = all_state_bytes(step);
  const double scale0 = step.scaler().scale();
  step.set_micro_batch_multipliers({1.0, 0x1p24});
  const StepResult r = step.step(batch);
  EXPECT_TRUE(r.skipped);
  EXPECT_EQ(bitwise_mismatches(before, all_state_bytes(step)), 0u);
  EXPECT_EQ(step.scaler().scale(), scale0 / 2);
  EXPECT_EQ(step.unscale_passes(), 2);  // one per step, whatever the number of micro-batches
  step.set_micro_batch_multipliers({});
  EXPECT_FALSE(step.step(batch).skipped);

  cfg.precision.compute = DType::f32;
  TrainStep fp32(dev, cfg);
  fp32.set_micro_batch_multipliers({1.0, 0x1p24});
  fp32.forward_backward(batch);
  for (const auto& [name, g] : fp32.gradients()) EXPECT_FALSE(ops::any_nonfinite(g)) << name;
}

// The loss scale multiplies the backward pass and is divided out once: the
// unscaled fp16 gradients are the fp32 run's within fp16 storage rounding of
// the activations and their gradients (a few 2^-11 relative, compounded).
TEST_P(StepScaler, UnscaledGradientsMatchFp32) {
  HR_TEST_DEVICE(dev, GetParam());
  StepConfig cfg = test::tiny_transformer_config(DType::f32);
  const Batch batch = make_lm_batch(dev, cfg.transformer, cfg.batch, cfg.seq_len, 1);
  TrainStep ref(dev, cfg);
  ref.forward_backward(batch);
  cfg.precision.compute = DType::f16;
  TrainStep half(dev, cfg);
  half.forward_backward(batch);
  EXPECT_FALSE(half.gradients_nonfinite());
  const double err = rel_l2(test::flat(test::grad_values(half)), test::flat(test::grad_values(ref)));
  RecordProperty("grad_rel_l2", fmt::format("{:.3e}", err));
  EXPECT_LT(err, tol::kFp16StepGradRelL2);
}

INSTANTIATE_TEST_SUITE_P(Step, StepScaler, testing::Values(BackendKind::cpu, BackendKind::cuda),
                         test::backend_param_name);

class StepAccumulation : public testing::TestWithParam<BackendKind> {};

TEST_P(StepAccumulation, LossNormalisationPolicies) {
  HR_TEST_DEVICE(dev, GetParam());
  StepConfig cfg = test::tiny_transformer_config(DType::f32);
  cfg.batch = 4;
  const std::vector<int64_t> lengths{12, 3, 9, 12};  // unequal real tokens per micro-batch
  const Batch batch = make_lm_batch(dev, cfg.transformer, cfg.batch, cfg.seq_len, 2, lengths);
  auto grads = [&](int64_t micro, LossNormalization norm, double* loss) {
    StepConfig c = cfg;
    c.micro_batch = micro;
    c.loss_norm = norm;
    TrainStep s(dev, c);
    *loss = s.forward_backward(batch);
    return test::flat(test::grad_values(s));
  };
  double l_full = 0, l_win = 0, l_k = 0, l_none = 0;
  const auto full = grads(4, LossNormalization::mean_div_k, &l_full);
  const auto window = grads(1, LossNormalization::sum_div_window_items, &l_win);
  EXPECT_LT(rel_l2(window, full), 1e-5);
  EXPECT_NEAR(l_win, l_full, 1e-5 * l_full);
  // Per-micro-batch means divided by K weight the tokens of short rows more.
  const auto mean_k = grads(1, LossNormalization::mean_div_k, &l_k);
  EXPECT_GT(rel_l2(mean_k, full), 1e-3);
  // Without the division: K times the mean_div_k gradient.
  const auto none = grads(1, LossNormalization::no_division, &l_none);
  std::vector<float> k_times(mean_k.size());
  for (size_t i = 0; i < k_times.size(); ++i) k_times[i] = 4.f * mean_k[i];
  EXPECT_LT(rel_l2(none, k_times), 1e-6);
  EXPECT_NEAR(l_none, 4 * l_k, 1e-5 * l_none);
}

INSTANTIATE_TEST_SUITE_P(Step, StepAccumulation, testing::Values(BackendKind::cpu, BackendKind::cuda),
                         test::backend_param_name);

}  // namespace
