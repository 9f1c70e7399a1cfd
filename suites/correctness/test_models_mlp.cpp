// The controlled MLP under the training step: regression and classification
// learn in fp32, fp16 and bf16 with each norm slot; checkpointing reproduces the
// gradients bit for bit with dropout on, counts two forwards per segment, and
// does not update BatchNorm running statistics twice (the broken variant does);
// ghost BatchNorm over virtual batches differs from whole-micro-batch BatchNorm;
// the fp32 model's loss, every gradient and the running statistics match the
// float64 reference (suites/common/ref_mlp.hpp), whose own backward matches its
// central finite differences, each check with a gross and a subtle control.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "harness/data/synthetic.hpp"
#include "harness/models/mlp.hpp"
#include "harness/properties/accum_support.hpp"
#include "harness/registry.hpp"
#include "harness/step/train_step.hpp"
#include "suites/common/property_check.hpp"
#include "suites/common/ref_mlp.hpp"
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

// ---- The model against its float64 reference (suites/common/ref_mlp.hpp) ----
// Model-level OPS-1 (the loss and the BatchNorm running statistics against
// float64) and OPS-2 (every gradient against float64; the reference's own
// backward against its central finite differences), for each task and norm slot.
// Every check has a gross and a subtle negative control, each run through the
// same check and bound; a subtle one must land within kSubtleControlMaxPower of it.

struct RefCase {
  MlpTask task;
  NormKind norm;
};

std::vector<RefCase> ref_cases() {
  std::vector<RefCase> v;
  for (MlpTask t : {MlpTask::regression, MlpTask::classification})
    for (NormKind n : {NormKind::none, NormKind::layernorm, NormKind::batchnorm}) v.push_back({t, n});
  return v;
}

std::string case_name(const RefCase& c) {
  return fmt::format("{} / {}", mlp_task_name(c.task), norm_kind_name(c.norm));
}

// Two micro-batches (the reference sees the whole batch with the step's
// normaliser), BatchNorm over ghost virtual batches of a quarter of them, so the
// statistics groups and the running statistics' fold order are the step's.
StepConfig ref_config(const RefCase& c, int64_t batch) {
  StepConfig cfg = test::tiny_mlp_config(DType::f32, c.norm);
  cfg.mlp.task = c.task;
  cfg.batch = batch;
  cfg.micro_batch = batch / 2;
  cfg.mlp.bn_virtual_batch = c.norm == NormKind::batchnorm ? batch / 4 : 0;
  return cfg;
}

// The model against the reference runs on 2048 rows: the loss normaliser is then
// >= 2048 items, so counting one item too many moves the loss by <= 1/2049 (within
// 100x of kModelLossRel), and BatchNorm's groups have 512 rows, so the biased
// variance estimator moves the running variance by ~1/511 of its batch part
// (within 100x of kMlpRunningStatsRelL2). Finite differences need ~100 reference
// forwards per case and run on 256 rows.
constexpr int64_t kModelRefRows = 2048;
constexpr int64_t kFiniteDifferenceRows = 256;

// The fp32 model's pass, and the reference's inputs read from the same
// parameters and batch.
struct ModelPass {
  double loss = 0;
  std::map<std::string, std::vector<float>> grads;
  std::vector<float> running;  // per block: running mean, then running variance
  test::RefMlpParams params;
  test::RefMlpBatch batch;
};

ModelPass run_model(Device& dev, const StepConfig& cfg, uint64_t seed) {
  TrainStep step(dev, cfg);
  // Norm affine parameters start at one and zero, under which a gamma or beta
  // applied to the wrong feature (or not at all) is invisible: draw them instead.
  uint64_t draw = seed;
  for (Param& p : step.params().all()) {
    if (p.name.rfind("norms.", 0) != 0) continue;
    const bool gamma = p.name.find(".weight") != std::string::npos;
    const auto v = test::random_nonzero(static_cast<size_t>(p.master.numel()), ++draw * 7919, gamma ? 0.5f : -0.5f,
                                        gamma ? 1.5f : 0.5f);
    p.master.copy_from(Tensor::from_host(dev, v, p.master.shape(), DType::f32, Consumer::workspace));
  }
  step.params().sync_compute();
  const Batch batch = make_mlp_batch(dev, cfg.mlp, cfg.batch, seed);
  ModelPass out;
  out.loss = step.forward_backward(batch);
  out.grads = test::grad_values(step);
  for (const auto& [name, t] : step.model().buffers()) {
    const auto v = t.to_host_f32();
    out.running.insert(out.running.end(), v.begin(), v.end());
  }
  out.params = test::master_weights_f64(step.params());
  test::RefMlpBatch& rb = out.batch;
  rb.rows = cfg.batch;
  const auto x = batch.x.to_host_f32();
  rb.x.assign(x.begin(), x.end());
  // The normaliser from the definition (every item of the batch), not from the step.
  if (cfg.mlp.task == MlpTask::regression) {
    const auto t = batch.targets_f32.to_host_f32();
    rb.targets.assign(t.begin(), t.end());
    rb.count = static_cast<double>(cfg.batch * cfg.mlp.out_dim);
  } else {
    rb.classes = batch.targets.to_host_i32();
    rb.count = static_cast<double>(cfg.batch);
  }
  rb.bn_group_rows = cfg.mlp.bn_virtual_batch > 0 ? cfg.mlp.bn_virtual_batch : cfg.micro_batch;
  return out;
}

double loss_rel(double got, double want) { return std::fabs(got - want) / std::fabs(want); }

// The worst parameter's relative L2 over all its elements. Tensors whose exact
// gradient is zero (a linear bias feeding BatchNorm; see props::exact_zero_gradients)
// are measured against the norm of all gradients, as GA-1 does: their computed
// values are rounding noise on both sides.
double grads_rel_l2(const StepConfig& cfg, const std::map<std::string, std::vector<float>>& got,
                    const test::RefMlpParams& want) {
  const auto zero = props::exact_zero_gradients(cfg);
  double all2 = 0;
  for (const auto& [name, g] : want)
    for (double v : g) all2 += v * v;
  double worst = 0;
  for (const auto& [name, g] : got) {
    const auto& w = want.at(name);
    double diff2 = 0, ref2 = 0;
    for (size_t i = 0; i < g.size(); ++i) {
      diff2 += (g[i] - w[i]) * (g[i] - w[i]);
      ref2 += w[i] * w[i];
    }
    const double e = std::sqrt(diff2 / (zero && zero(name) ? all2 : ref2));
    if (!(e <= worst)) worst = e;  // a NaN wins
  }
  return worst;
}

std::vector<double> running_flat(const test::RefMlpResult& r) {
  std::vector<double> v;
  for (size_t l = 0; l < r.running_mean.size(); ++l) {
    v.insert(v.end(), r.running_mean[l].begin(), r.running_mean[l].end());
    v.insert(v.end(), r.running_var[l].begin(), r.running_var[l].end());
  }
  return v;
}

// Asserts and records one measurement of a case.
void expect_measurement(const Measurement& m, const std::string& case_label) {
  EXPECT_TRUE(test::passed(m)) << case_label;
  testing::Test::RecordProperty(case_label + " | " + m.title, fmt::format("{:.3e}", m.error));
}

class MlpReference : public testing::TestWithParam<BackendKind> {};

TEST_P(MlpReference, LossGradientsAndRunningStatisticsMatchFloat64) {
  HR_TEST_DEVICE(dev, GetParam());
  for (const RefCase& c : ref_cases()) {
    const std::string label = case_name(c);
    SCOPED_TRACE(label);
    const StepConfig cfg = ref_config(c, kModelRefRows);
    const ModelPass m = run_model(dev, cfg, 31);
    auto ref = [&](test::RefMlpConventions conv, double count) {
      test::RefMlpBatch b = m.batch;
      b.count = count;
      return test::ref_mlp_pass(cfg.mlp, m.params, b, true, conv);
    };
    const double count = m.batch.count;
    test::RefMlpConventions relu, erf, eps_outside, biased;
    relu.gelu = test::RefGelu::relu;
    erf.gelu = test::RefGelu::erf_form;
    eps_outside.eps_inside_sqrt = false;
    biased.running_var_unbiased = false;
    const auto r = ref({}, count), r_relu = ref(relu, count), r_erf = ref(erf, count);

    // The loss. Gross: the sum without its normaliser. Subtle: the normaliser
    // counting one item too many (an error of 1 / (count + 1), at most 1/2049).
    expect_measurement(make_check("OPS-1", "loss against float64", loss_rel(m.loss, r.loss), tol::kModelLossRel),
                       label);
    expect_measurement(make_negative_control("OPS-1", "loss against a reference without the normaliser is caught",
                                             loss_rel(m.loss, ref({}, 1.0).loss), tol::kModelLossRel),
                       label);
    expect_measurement(make_subtle_control("OPS-1", "loss against a reference counting one more item is caught",
                                           loss_rel(m.loss, ref({}, count + 1).loss), tol::kModelLossRel),
                       label);

    // Every gradient. Gross: ReLU in place of GELU. Subtle: the erf form of GELU in
    // place of the tanh form (PyTorch's default), and with LayerNorm eps outside
    // the square root.
    expect_measurement(make_check("OPS-2", "every gradient against float64", grads_rel_l2(cfg, m.grads, r.grads),
                                  tol::kModelGradFdRelL2),
                       label);
    expect_measurement(make_negative_control("OPS-2", "gradients against a ReLU reference are caught",
                                             grads_rel_l2(cfg, m.grads, r_relu.grads), tol::kModelGradFdRelL2),
                       label);
    expect_measurement(make_subtle_control("OPS-2", "gradients against an erf-GELU reference are caught",
                                           grads_rel_l2(cfg, m.grads, r_erf.grads), tol::kModelGradFdRelL2),
                       label);
    if (c.norm == NormKind::layernorm)
      expect_measurement(
          make_subtle_control("OPS-2", "gradients against a reference with eps outside the square root are caught",
                              grads_rel_l2(cfg, m.grads, ref(eps_outside, count).grads), tol::kModelGradFdRelL2),
          label);

    if (c.norm != NormKind::batchnorm) continue;
    // The running statistics. Gross: a model that folds each group in twice (the
    // recompute of a checkpointed block updating them again). Subtle: a reference
    // with the biased variance estimator.
    expect_measurement(make_check("OPS-1", "BatchNorm running statistics against float64",
                                  rel_l2(m.running, running_flat(r)), tol::kMlpRunningStatsRelL2),
                       label);
    StepConfig twice = cfg;
    twice.checkpoint.every_k_blocks = 1;
    twice.checkpoint.update_bn_stats_on_recompute = true;
    expect_measurement(make_negative_control("OPS-1", "running statistics folded in twice are caught",
                                             rel_l2(run_model(dev, twice, 31).running, running_flat(r)),
                                             tol::kMlpRunningStatsRelL2),
                       label);
    expect_measurement(make_subtle_control("OPS-1", "running statistics against a biased-variance reference are caught",
                                           rel_l2(m.running, running_flat(ref(biased, count))),
                                           tol::kMlpRunningStatsRelL2),
                       label);
  }
}

INSTANTIATE_TEST_SUITE_P(Models, MlpReference, testing::Values(BackendKind::cpu, BackendKind::cuda),
                         test::backend_param_name);

double rel_l2_f64(const std::vector<double>& x, const std::vector<double>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    num += (x[i] - ref[i]) * (x[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  return std::sqrt(num / den);
}

// The reference's analytic backward against central differences of its own loss
// at eight elements of every parameter. Gross: GELU's derivative without its
// x sech^2 term; with a norm also the statistics treated as constants. Subtle:
// without a norm the erf GELU's derivative under the tanh forward; with a norm
// eps left out of d rstd / d var.
TEST(MlpReferenceBackward, MatchesItsCentralFiniteDifferences) {
  HR_TEST_DEVICE(dev, BackendKind::cpu);  // only to draw the parameters and batch
  using Fault = test::RefMlpBackwardFault;
  for (const RefCase& c : ref_cases()) {
    const std::string label = case_name(c);
    SCOPED_TRACE(label);
    const StepConfig cfg = ref_config(c, kFiniteDifferenceRows);
    ModelPass m = run_model(dev, cfg, 31);
    test::RefMlpParams p = m.params;
    std::mt19937_64 rng(17);
    std::vector<std::pair<std::string, size_t>> picks;
    std::vector<double> fd;
    for (auto& [name, v] : p) {
      for (int k = 0; k < 8; ++k) {
        const size_t i = std::uniform_int_distribution<size_t>(0, v.size() - 1)(rng);
        const double x0 = v[i], h = 1e-6 * std::max(1.0, std::fabs(x0));
        v[i] = x0 + h;
        const double fp = test::ref_mlp_loss(cfg.mlp, p, m.batch);
        v[i] = x0 - h;
        const double fm = test::ref_mlp_loss(cfg.mlp, p, m.batch);
        v[i] = x0;
        picks.emplace_back(name, i);
        fd.push_back((fp - fm) / (2 * h));
      }
    }
    auto error = [&](Fault f) {
      const auto r = test::ref_mlp_pass(cfg.mlp, p, m.batch, true, {}, f);
      std::vector<double> g;
      for (const auto& [name, i] : picks) g.push_back(r.grads.at(name)[i]);
      return rel_l2_f64(g, fd);
    };
    const double bound = tol::kMlpRefGradFdRelL2;
    expect_measurement(make_check("OPS-2", "reference gradient against its central differences", error(Fault::none),
                                  bound),
                       label);
    expect_measurement(make_negative_control("OPS-2", "a GELU derivative without its x term is caught",
                                             error(Fault::gelu_drops_x_term), bound),
                       label);
    if (c.norm == NormKind::none) {
      expect_measurement(make_subtle_control("OPS-2", "the erf GELU's derivative under the tanh forward is caught",
                                             error(Fault::gelu_erf_derivative), bound),
                         label);
    } else {
      expect_measurement(make_negative_control("OPS-2", "a norm backward with constant statistics is caught",
                                               error(Fault::norm_stats_constant), bound),
                         label);
      expect_measurement(make_subtle_control("OPS-2", "a norm backward without eps in d rstd / d var is caught",
                                             error(Fault::norm_drops_eps), bound),
                         label);
    }
  }
}

}  // namespace
