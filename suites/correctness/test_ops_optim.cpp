// OPS-1 and DET-1 for the optimizer steps on every backend x parameter dtype:
// SGD (with and without momentum and weight decay) and AdamW (bias-corrected,
// decoupled weight decay) against a float64 reference over several steps, and the
// behaviour MP-4 builds on: an fp16/bf16 parameter whose update is below half an
// ulp stays bit-for-bit unchanged, where an fp32 parameter moves.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "harness/check.hpp"
#include "kernels/optim/optim.hpp"
#include "kernels/optim/optim_ref.hpp"
#include "suites/common/op_check.hpp"
#include "suites/common/test_support.hpp"
#include "harness/tolerances.hpp"

namespace {

using hr::Consumer;
using hr::DType;
using hr::Tensor;
using hr::test::Guarded;
using hr::test::stored_values;

constexpr int kSteps = 5;

class OpsOptim : public testing::TestWithParam<hr::test::BackendDType> {
 protected:
  DType dtype() const { return GetParam().dtype; }
  void expect_close(const std::vector<float>& got, const std::vector<double>& ref, const std::string& what) {
    EXPECT_TRUE(hr::test::nmse_within(got, ref, hr::tol::kOptimizerNmse(dtype()), what));
    worst_ = std::max(worst_, hr::test::nmse(got, ref));
  }
  void TearDown() override { RecordProperty("max_nmse", fmt::format("{:.3e}", worst_)); }
  double worst_ = 0;
};

// Sizes for the multi-step comparisons: the edge sizes up to 4097 and one large.
std::vector<int64_t> optim_sizes() { return {1, 15, 16, 17, 127, 128, 129, 4097, int64_t{1} << 18}; }

TEST_P(OpsOptim, SgdMatchesFloat64ReferenceOverSteps) {
  HR_TEST_DEVICE(dev, GetParam().backend);
  for (float momentum : {0.f, 0.9f}) {
    for (float wd : {0.f, 0.01f}) {
      const hr::ops::SgdConfig cfg{0.05f, momentum, wd};
      for (int64_t n : optim_sizes()) {
        Guarded param(dev, {n}, dtype(), 64, Consumer::weights);
        param.set(hr::test::random_nonzero(static_cast<size_t>(n), 3000 + n));
        Tensor buf = Tensor::zeros(dev, {n}, DType::f32, Consumer::optimizer_state);
        hr::ref::OptimState ref{stored_values(param.tensor()), {}, {}};
        for (int step = 1; step <= kSteps; ++step) {
          const Tensor g = Tensor::from_host(dev, hr::test::random_nonzero(static_cast<size_t>(n), 3100 + n * step),
                                             {n}, DType::f32, Consumer::gradients);
          hr::ops::sgd_step(param.tensor(), g, buf, cfg);
          hr::ref::sgd_step(ref, stored_values(g), cfg.lr, cfg.momentum, cfg.weight_decay);
        }
        const std::string what = fmt::format("sgd momentum={} wd={} n={}", momentum, wd, n);
        expect_close(param.values(), ref.param, what);
        if (momentum != 0.f) expect_close(buf.to_host_f32(), ref.buf1, what + " momentum buffer");
        EXPECT_TRUE(param.guards_intact()) << what;
      }
    }
  }
}

TEST_P(OpsOptim, AdamWMatchesFloat64ReferenceOverSteps) {
  HR_TEST_DEVICE(dev, GetParam().backend);
  const hr::ops::AdamWConfig cfg{};  // lr 1e-3, betas (0.9, 0.999), eps 1e-8, wd 0.01
  for (int64_t n : optim_sizes()) {
    Guarded param(dev, {n}, dtype(), 64, Consumer::weights);
    param.set(hr::test::random_nonzero(static_cast<size_t>(n), 3200 + n));
    Tensor m = Tensor::zeros(dev, {n}, DType::f32, Consumer::optimizer_state);
    Tensor v = Tensor::zeros(dev, {n}, DType::f32, Consumer::optimizer_state);
    hr::ref::OptimState ref{stored_values(param.tensor()), {}, {}};
    for (int step = 1; step <= kSteps; ++step) {
      // Gradients of varied magnitude, so bias correction and eps both matter.
      const Tensor g = Tensor::from_host(
          dev, hr::test::random_nonzero(static_cast<size_t>(n), 3300 + n * step, -0.1f, 0.1f), {n}, DType::f32,
          Consumer::gradients);
      hr::ops::adamw_step(param.tensor(), g, m, v, step, cfg);
      hr::ref::adamw_step(ref, stored_values(g), step, cfg.lr, cfg.beta1, cfg.beta2, cfg.eps, cfg.weight_decay);
    }
    const std::string what = "adamw n=" + std::to_string(n);
    expect_close(param.values(), ref.param, what);
    expect_close(m.to_host_f32(), ref.buf1, what + " m");
    expect_close(v.to_host_f32(), ref.buf2, what + " v");
    EXPECT_TRUE(param.guards_intact()) << what;
  }
}

TEST_P(OpsOptim, AdamWFirstStepMovesEachParameterByLr) {
  // Bias correction: at step 1, m_hat = g and v_hat = g^2, so every parameter
  // moves by lr * g / (|g| + eps) ~ lr. Without the correction it would move by
  // lr * 0.1 / sqrt(0.001) ~ 3.2 lr.
  HR_TEST_DEVICE(dev, GetParam().backend);
  if (dtype() != DType::f32) GTEST_SKIP() << "measured on fp32 parameters, where a step of lr is representable";
  const int64_t n = 1000;
  hr::ops::AdamWConfig cfg;
  cfg.weight_decay = 0.f;
  const std::vector<float> p0 = hr::test::random_nonzero(static_cast<size_t>(n), 3400);
  Tensor param = Tensor::from_host(dev, p0, {n}, DType::f32, Consumer::weights);
  Tensor m = Tensor::zeros(dev, {n}, DType::f32, Consumer::optimizer_state);
  Tensor v = Tensor::zeros(dev, {n}, DType::f32, Consumer::optimizer_state);
  const Tensor g = Tensor::from_host(dev, hr::test::random_nonzero(static_cast<size_t>(n), 3401), {n}, DType::f32,
                                     Consumer::gradients);
  hr::ops::adamw_step(param, g, m, v, 1, cfg);
  const std::vector<float> p1 = param.to_host_f32();
  for (int64_t i = 0; i < n; ++i) ASSERT_NEAR(std::fabs(p1[i] - p0[i]), cfg.lr, 1e-6) << i;
}

TEST_P(OpsOptim, UpdateBelowHalfAnUlpIsLostIn16BitParameters) {
  // MP-4's premise. At 1.0 an fp16 ulp is 2^-10 (bf16: 2^-7); lr * g = 1e-4 is
  // below half of either, so a 16-bit parameter stays exactly 1.0 while an fp32
  // one moves by 1e-4. SGD and AdamW alike (AdamW at lr 1e-4 moves by ~lr).
  HR_TEST_DEVICE(dev, GetParam().backend);
  const int64_t n = 129;
  const std::vector<float> ones(static_cast<size_t>(n), 1.f);
  const Tensor g = Tensor::from_host(dev, std::vector<float>(static_cast<size_t>(n), 1.f), {n}, DType::f32,
                                     Consumer::gradients);
  Tensor sgd_param = Tensor::from_host(dev, ones, {n}, dtype(), Consumer::weights);
  Tensor no_buf;
  hr::ops::sgd_step(sgd_param, g, no_buf, hr::ops::SgdConfig{1e-4f, 0.f, 0.f});
  Tensor adam_param = Tensor::from_host(dev, ones, {n}, dtype(), Consumer::weights);
  Tensor m = Tensor::zeros(dev, {n}, DType::f32, Consumer::optimizer_state);
  Tensor v = Tensor::zeros(dev, {n}, DType::f32, Consumer::optimizer_state);
  hr::ops::AdamWConfig acfg;
  acfg.lr = 1e-4f;
  acfg.weight_decay = 0.f;
  hr::ops::adamw_step(adam_param, g, m, v, 1, acfg);
  const Tensor before = Tensor::from_host(dev, ones, {n}, dtype(), Consumer::weights);
  if (dtype() == DType::f32) {
    EXPECT_NE(sgd_param.to_host_bytes(), before.to_host_bytes());
    EXPECT_NEAR(sgd_param.to_host_f32()[0], 1.f - 1e-4f, 1e-7);
    EXPECT_NE(adam_param.to_host_bytes(), before.to_host_bytes());
  } else {
    EXPECT_EQ(sgd_param.to_host_bytes(), before.to_host_bytes());
    EXPECT_EQ(adam_param.to_host_bytes(), before.to_host_bytes());
  }
}

TEST_P(OpsOptim, SameInputsGiveBitwiseIdenticalSteps) {
  HR_TEST_DEVICE(dev, GetParam().backend);
  const int64_t n = 4097;
  const std::vector<float> p0 = hr::test::random_nonzero(static_cast<size_t>(n), 3500);
  const Tensor g = Tensor::from_host(dev, hr::test::random_nonzero(static_cast<size_t>(n), 3501), {n}, DType::f32,
                                     Consumer::gradients);
  auto run = [&] {
    Tensor p = Tensor::from_host(dev, p0, {n}, dtype(), Consumer::weights);
    Tensor buf = Tensor::zeros(dev, {n}, DType::f32, Consumer::optimizer_state);
    Tensor m = Tensor::zeros(dev, {n}, DType::f32, Consumer::optimizer_state);
    Tensor v = Tensor::zeros(dev, {n}, DType::f32, Consumer::optimizer_state);
    for (int step = 1; step <= 3; ++step) {
      hr::ops::sgd_step(p, g, buf, hr::ops::SgdConfig{0.01f, 0.9f, 0.01f});
      hr::ops::adamw_step(p, g, m, v, step, hr::ops::AdamWConfig{});
    }
    return std::vector<std::vector<uint8_t>>{p.to_host_bytes(), buf.to_host_bytes(), m.to_host_bytes(),
                                             v.to_host_bytes()};
  };
  EXPECT_EQ(run(), run());
}

TEST_P(OpsOptim, BadStateOrStepIsRefused) {
  HR_TEST_DEVICE(dev, GetParam().backend);
  const int64_t n = 16;
  Tensor p = Tensor::zeros(dev, {n}, dtype(), Consumer::weights);
  const Tensor g = Tensor::zeros(dev, {n}, DType::f32, Consumer::gradients);
  Tensor none;
  EXPECT_THROW(hr::ops::sgd_step(p, g, none, hr::ops::SgdConfig{0.1f, 0.9f, 0.f}), hr::Error);
  Tensor m = Tensor::zeros(dev, {n}, DType::f32, Consumer::optimizer_state);
  Tensor v16 = Tensor::zeros(dev, {n}, DType::f16, Consumer::optimizer_state);
  EXPECT_THROW(hr::ops::adamw_step(p, g, m, v16, 1, hr::ops::AdamWConfig{}), hr::Error);
  Tensor v = Tensor::zeros(dev, {n}, DType::f32, Consumer::optimizer_state);
  EXPECT_THROW(hr::ops::adamw_step(p, g, m, v, 0, hr::ops::AdamWConfig{}), hr::InvalidArgument);
}

INSTANTIATE_TEST_SUITE_P(AllBackends, OpsOptim, testing::ValuesIn(hr::test::all_backend_dtypes()),
                         hr::test::param_name);

}  // namespace
