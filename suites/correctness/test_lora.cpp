// LR-3: LoRA adapter gradients of the fp32 step against float64 central finite
// differences of the independent float64 reference transformer (and MLP), run with the
// merged weights W + (alpha/r) B A (computed in double). Also: the frozen base has
// no gradient to read. Controls: the reference at scale alpha (gross) and at a
// scale off by kLoraFdSubtleScale (subtle, ~30x the bound) must both be caught.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "harness/data/synthetic.hpp"
#include "harness/step/train_step.hpp"
#include "harness/tolerances.hpp"
#include "suites/common/ref_mlp.hpp"
#include "suites/common/ref_transformer.hpp"
#include "suites/common/step_support.hpp"
#include "suites/common/test_support.hpp"

namespace {

using namespace hr;

double rel_l2(const std::vector<double>& x, const std::vector<double>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < x.size(); ++i) num += (x[i] - ref[i]) * (x[i] - ref[i]), den += ref[i] * ref[i];
  return std::sqrt(num / den);
}

class LoraGrad : public testing::TestWithParam<BackendKind> {};

TEST_P(LoraGrad, AdapterGradientsMatchFloat64FiniteDifferences) {
  HR_TEST_DEVICE(dev, GetParam());
  StepConfig cfg = test::tiny_transformer_config(DType::f32);
  cfg.seq_len = 8;
  cfg.micro_batch = cfg.batch;  // one micro-batch: the loss is the mean over real tokens
  cfg.adapters.kind = AdapterKind::lora;
  cfg.adapters.rank = 4;
  cfg.adapters.alpha = 8.f;
  TrainStep step(dev, cfg);
  // B non-zero (at B = 0 the gradient of A vanishes identically).
  std::mt19937_64 rng(23);
  std::normal_distribution<float> nd(0.f, 0.05f);
  for (Param& p : step.params().all()) {
    if (p.name.find("lora_B") == std::string::npos) continue;
    std::vector<float> v(static_cast<size_t>(p.master.numel()));
    for (float& x : v) x = nd(rng);
    p.master.copy_from(Tensor::from_host(dev, v, p.master.shape(), DType::f32, Consumer::workspace));
  }
  step.params().sync_compute();
  const std::vector<int64_t> lengths{8, 5, 8, 3};
  const Batch batch = make_lm_batch(dev, cfg.transformer, cfg.batch, cfg.seq_len, 5, lengths);
  step.forward_backward(batch);
  EXPECT_THROW(step.grad("h.0.attn.q.weight"), std::exception);  // frozen: no gradient buffer

  test::RefParams ref = test::master_weights_f64(step.params());
  const test::RefLmBatch rb = test::ref_lm_batch(batch, cfg.batch, cfg.seq_len);
  double count = 0;
  for (int32_t t : rb.targets) count += t != cfg.transformer.ignore_index;
  const int64_t C = cfg.transformer.d_model, r = cfg.adapters.rank;
  // The reference loss with q and v merged at adapter scale s.
  auto ref_loss = [&](const test::RefParams& p, double s) {
    test::RefParams merged = p;
    for (int64_t l = 0; l < cfg.transformer.layers; ++l)
      for (const char* proj : {"q", "v"}) {
        const std::string h = fmt::format("h.{}.attn.{}.", l, proj);
        const auto& A = p.at(h + "lora_A");
        const auto& B = p.at(h + "lora_B");
        auto& W = merged[h + "weight"];
        for (int64_t o = 0; o < C; ++o)
          for (int64_t i = 0; i < C; ++i)
            for (int64_t k = 0; k < r; ++k)
              W[static_cast<size_t>(o * C + i)] += s * B[static_cast<size_t>(o * r + k)] * A[static_cast<size_t>(k * C + i)];
      }
    return test::ref_transformer_loss(cfg.transformer, merged, rb, count);
  };
  const double scale = static_cast<double>(cfg.adapters.alpha) / static_cast<double>(r);
  auto fd_error = [&](double s) {
    std::mt19937_64 pick(17);
    std::vector<double> got, want;
    test::RefParams p = ref;
    for (const Param& prm : step.params().all()) {
      if (prm.name.find("lora_") == std::string::npos) continue;
      const auto g = step.grad(prm.name).to_host_f32();
      for (int k = 0; k < 4; ++k) {
        const size_t i = std::uniform_int_distribution<size_t>(0, g.size() - 1)(pick);
        std::vector<double>& x = p[prm.name];
        const double x0 = x[i], h = 1e-6 * std::max(1.0, std::fabs(x0));
        x[i] = x0 + h;
        const double fp = ref_loss(p, s);
        x[i] = x0 - h;
        const double fm = ref_loss(p, s);
        x[i] = x0;
        got.push_back(g[i]);
        want.push_back((fp - fm) / (2 * h));
      }
    }
    return rel_l2(got, want);
  };
  const double err = fd_error(scale);
  RecordProperty("lora_grad_rel_l2", fmt::format("{:.3e}", err));
  EXPECT_LE(err, tol::kModelGradFdRelL2);
  const double gross = fd_error(static_cast<double>(cfg.adapters.alpha));  // alpha instead of alpha / r
  EXPECT_GT(gross, tol::kModelGradFdRelL2);
  const double subtle = fd_error(scale * (1 + tol::kLoraFdSubtleScale));
  RecordProperty("lora_grad_subtle_power", fmt::format("{:.3g}", subtle / tol::kModelGradFdRelL2));
  EXPECT_GT(subtle, tol::kModelGradFdRelL2);
  EXPECT_LE(subtle, tol::kSubtleControlMaxPower * tol::kModelGradFdRelL2);
  std::printf("LR-3 rel_l2 %.3e gross %.3e subtle %.3e\n", err, gross, subtle);
}

// The MLP's hidden linears: at B = 0 the loss is the base model's bitwise, only the
// adapters have gradients, and B's are non-zero (A's vanish while B is zero).
TEST(LoraMlp, IdentityAtInitAndOnlyAdapterGradients) {
  HR_TEST_DEVICE(dev, BackendKind::cpu);
  StepConfig base_cfg = test::tiny_mlp_config(DType::f32, NormKind::layernorm);
  StepConfig cfg = base_cfg;
  cfg.adapters.kind = AdapterKind::lora;
  cfg.adapters.rank = 4;
  cfg.adapters.alpha = 8.f;
  TrainStep base(dev, base_cfg), step(dev, cfg);
  const Batch batch = make_mlp_batch(dev, cfg.mlp, cfg.batch, 9);
  EXPECT_EQ(step.loss(batch), base.loss(batch));
  step.forward_backward(batch);
  const auto grads = step.gradients();
  ASSERT_EQ(grads.size(), static_cast<size_t>(2 * (cfg.mlp.layers - 1)));
  for (const auto& [name, g] : grads) {
    EXPECT_NE(name.find("lora_"), std::string::npos) << name;
    if (name.find("lora_B") != std::string::npos) EXPECT_GT(test::squared_norm(g.to_host_f32()), 0.0) << name;
  }
}

// LR-3 on the MLP (LayerNorm): adapter gradients against float64 central
// differences of the reference MLP with merged hidden weights; the same controls.
TEST(LoraMlp, AdapterGradientsMatchFloat64FiniteDifferences) {
  HR_TEST_DEVICE(dev, BackendKind::cpu);
  StepConfig cfg = test::tiny_mlp_config(DType::f32, NormKind::layernorm);
  cfg.micro_batch = cfg.batch;
  cfg.adapters.kind = AdapterKind::lora;
  cfg.adapters.rank = 4;
  cfg.adapters.alpha = 8.f;
  TrainStep step(dev, cfg);
  std::mt19937_64 rng(29);
  std::normal_distribution<float> nd(0.f, 0.05f);
  for (Param& p : step.params().all()) {
    if (p.name.find("lora_B") == std::string::npos) continue;
    std::vector<float> v(static_cast<size_t>(p.master.numel()));
    for (float& x : v) x = nd(rng);
    p.master.copy_from(Tensor::from_host(dev, v, p.master.shape(), DType::f32, Consumer::workspace));
  }
  step.params().sync_compute();
  const Batch batch = make_mlp_batch(dev, cfg.mlp, cfg.batch, 11);
  step.forward_backward(batch);
  test::RefMlpParams ref = test::master_weights_f64(step.params());
  test::RefMlpBatch rb;
  rb.rows = cfg.batch;
  const auto x = batch.x.to_host_f32();
  rb.x.assign(x.begin(), x.end());
  const auto t = batch.targets_f32.to_host_f32();
  rb.targets.assign(t.begin(), t.end());
  rb.count = static_cast<double>(cfg.batch * cfg.mlp.out_dim);
  rb.bn_group_rows = cfg.micro_batch;
  const int64_t r = cfg.adapters.rank, W = cfg.mlp.width;
  auto ref_loss = [&](const test::RefMlpParams& p, double s) {
    test::RefMlpParams merged = p;
    for (int64_t l = 0; l + 1 < cfg.mlp.layers; ++l) {
      const int64_t in = l == 0 ? cfg.mlp.in_dim : W;
      const auto& A = p.at(fmt::format("layers.{}.lora_A", l));
      const auto& B = p.at(fmt::format("layers.{}.lora_B", l));
      auto& Wt = merged[fmt::format("layers.{}.weight", l)];
      for (int64_t o = 0; o < W; ++o)
        for (int64_t i = 0; i < in; ++i)
          for (int64_t k = 0; k < r; ++k)
            Wt[static_cast<size_t>(o * in + i)] += s * B[static_cast<size_t>(o * r + k)] * A[static_cast<size_t>(k * in + i)];
    }
    return test::ref_mlp_loss(cfg.mlp, merged, rb);
  };
  const double scale = static_cast<double>(cfg.adapters.alpha) / static_cast<double>(r);
  auto fd_error = [&](double s) {
    std::mt19937_64 pick(19);
    std::vector<double> got, want;
    test::RefMlpParams p = ref;
    for (const auto& [name, gt] : step.gradients()) {
      const auto g = gt.to_host_f32();
      for (int k = 0; k < 6; ++k) {
        const size_t i = std::uniform_int_distribution<size_t>(0, g.size() - 1)(pick);
        std::vector<double>& v = p[name];
        const double x0 = v[i], h = 1e-6 * std::max(1.0, std::fabs(x0));
        v[i] = x0 + h;
        const double fp = ref_loss(p, s);
        v[i] = x0 - h;
        const double fm = ref_loss(p, s);
        v[i] = x0;
        got.push_back(g[i]);
        want.push_back((fp - fm) / (2 * h));
      }
    }
    return rel_l2(got, want);
  };
  const double err = fd_error(scale);
  EXPECT_LE(err, tol::kModelGradFdRelL2);
  EXPECT_GT(fd_error(static_cast<double>(cfg.adapters.alpha)), tol::kModelGradFdRelL2);
  const double subtle = fd_error(scale * (1 + tol::kLoraFdSubtleScale));
  EXPECT_GT(subtle, tol::kModelGradFdRelL2);
  EXPECT_LE(subtle, tol::kSubtleControlMaxPower * tol::kModelGradFdRelL2);
  std::printf("LR-3 mlp rel_l2 %.3e subtle %.3e\n", err, subtle);
}

INSTANTIATE_TEST_SUITE_P(Models, LoraGrad, testing::Values(BackendKind::cpu, BackendKind::cuda),
                         test::backend_param_name);

}  // namespace
