// BatchNorm conformance: training and eval forward, saved statistics, running
// statistics after one step (momentum, unbiased variance) and backward against the
// float64 reference (OPS-1); backward against finite differences (OPS-2); DET-1.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "harness/check.hpp"
#include "kernels/batchnorm/batchnorm.hpp"
#include "kernels/batchnorm/batchnorm_ref.hpp"
#include "suites/common/finite_diff.hpp"
#include "suites/common/op_check.hpp"
#include "suites/common/test_support.hpp"
#include "harness/tolerances.hpp"

namespace {

using hr::Consumer;
using hr::DType;
using hr::Tensor;
using hr::test::Guarded;
using hr::test::stored_values;
using vecd = std::vector<double>;

constexpr float kEps = 1e-5f;
constexpr float kMomentum = 0.1f;

class BatchNormOp : public testing::TestWithParam<hr::test::BackendDType> {};

struct Case {
  int64_t N, C;
  std::vector<float> x, g, b, dy, rm, rv;
  Case(int64_t n, int64_t c, uint64_t seed) : N(n), C(c) {
    x = hr::test::random_nonzero(static_cast<size_t>(N * C), seed, -1.5f, 2.5f);
    g = hr::test::random_nonzero(static_cast<size_t>(C), seed + 1, 0.5f, 1.5f);
    b = hr::test::random_nonzero(static_cast<size_t>(C), seed + 2, -0.5f, 0.5f);
    dy = hr::test::random_nonzero(static_cast<size_t>(N * C), seed + 3);
    rm = hr::test::random_nonzero(static_cast<size_t>(C), seed + 4);
    rv = hr::test::random_nonzero(static_cast<size_t>(C), seed + 5, 0.5f, 2.f);
  }
};

TEST_P(BatchNormOp, TrainEvalBackwardAndRunningStatsMatchFloat64Reference) {
  HR_TEST_DEVICE(dev, GetParam().backend);
  const DType dt = GetParam().dtype;
  const double bound = hr::tol::kRowwiseNmse(dt), b32 = hr::tol::kRowwiseNmse(DType::f32);
  struct Size {
    int64_t N, C;
  };
  for (Size s : {Size{16, 1}, Size{16, 15}, Size{16, 16}, Size{16, 17}, Size{16, 127}, Size{16, 128},
                 Size{16, 129}, Size{8, 4097}, Size{2, 33}, Size{129, 17}, Size{4097, 3}}) {
    const Case k(s.N, s.C, 300 + s.N * 7 + s.C);
    const std::string what = "N=" + std::to_string(s.N) + " C=" + std::to_string(s.C);
    Tensor x = Tensor::from_host(dev, k.x, {k.N, k.C}, dt, Consumer::activations);
    Tensor g = Tensor::from_host(dev, k.g, {k.C}, dt, Consumer::weights);
    Tensor b = Tensor::from_host(dev, k.b, {k.C}, dt, Consumer::weights);
    Tensor rm = Tensor::from_host(dev, k.rm, {k.C}, DType::f32, Consumer::weights);
    Tensor rv = Tensor::from_host(dev, k.rv, {k.C}, DType::f32, Consumer::weights);
    Guarded y(dev, {k.N, k.C}, dt), sm(dev, {k.C}, DType::f32), sr(dev, {k.C}, DType::f32);
    hr::ops::batchnorm_forward_train(x, g, b, kEps, kMomentum, rm, rv, y.tensor(), sm.tensor(), sr.tensor());

    const vecd xs = stored_values(k.x, dt), gs = stored_values(k.g, dt), bs = stored_values(k.b, dt);
    vecd rrm = hr::test::widen(k.rm), rrv = hr::test::widen(k.rv), ry;
    hr::ref::batchnorm_forward_train(xs, gs, bs, k.N, k.C, kEps, kMomentum, rrm, rrv, ry);
    EXPECT_TRUE(hr::test::nmse_within(y.values(), ry, bound, "batchnorm y " + what));
    // Statistics are fp32 sums of the stored x: the fp32 bound applies to every dtype.
    EXPECT_TRUE(hr::test::nmse_within(rm.to_host_f32(), rrm, b32, "running_mean " + what));
    EXPECT_TRUE(hr::test::nmse_within(rv.to_host_f32(), rrv, b32, "running_var " + what));

    // Eval with the updated running statistics.
    Guarded ye(dev, {k.N, k.C}, dt);
    hr::ops::batchnorm_forward_eval(x, g, b, kEps, rm, rv, ye.tensor());
    vecd rye;
    hr::ref::batchnorm_forward_eval(xs, gs, bs, k.N, k.C, kEps, hr::test::widen(rm.to_host_f32()),
                                    hr::test::widen(rv.to_host_f32()), rye);
    EXPECT_TRUE(hr::test::nmse_within(ye.values(), rye, bound, "batchnorm eval y " + what));

    Tensor dy = Tensor::from_host(dev, k.dy, {k.N, k.C}, dt, Consumer::activations);
    Guarded dx(dev, {k.N, k.C}, dt), dg(dev, {k.C}, DType::f32), db(dev, {k.C}, DType::f32);
    dg.set(std::vector<float>(static_cast<size_t>(k.C), 0.f));
    db.set(std::vector<float>(static_cast<size_t>(k.C), 0.f));
    hr::ops::batchnorm_backward(dy, x, g, sm.tensor(), sr.tensor(), dx.tensor(), dg.tensor(), db.tensor());
    vecd rdx, rdg, rdb;
    hr::ref::batchnorm_backward(stored_values(k.dy, dt), xs, gs, k.N, k.C, kEps, rdx, rdg, rdb);
    EXPECT_TRUE(hr::test::nmse_within(dx.values(), rdx, bound, "batchnorm dx " + what));
    EXPECT_TRUE(hr::test::nmse_within(dg.values(), rdg, b32, "batchnorm dgamma " + what));
    EXPECT_TRUE(hr::test::nmse_within(db.values(), rdb, b32, "batchnorm dbeta " + what));
    for (Guarded* o : {&y, &sm, &sr, &ye, &dx, &dg, &db}) EXPECT_TRUE(o->guards_intact()) << what;
  }
}

TEST_P(BatchNormOp, RunningStatisticsUseMomentumAndUnbiasedVariance) {
  HR_TEST_DEVICE(dev, GetParam().backend);
  // Two values per channel, {a, b}: batch mean (a+b)/2, biased var ((a-b)/2)^2,
  // unbiased var (a-b)^2/2: twice the biased one.
  Tensor x = Tensor::from_host(dev, {1.f, -2.f, 3.f, 6.f}, {2, 2}, GetParam().dtype, Consumer::activations);
  Tensor g = Tensor::from_host(dev, {1.f, 1.f}, {2}, DType::f32, Consumer::weights);
  Tensor b = Tensor::from_host(dev, {0.f, 0.f}, {2}, DType::f32, Consumer::weights);
  Tensor rm = Tensor::from_host(dev, {0.5f, 0.f}, {2}, DType::f32, Consumer::weights);
  Tensor rv = Tensor::from_host(dev, {1.f, 2.f}, {2}, DType::f32, Consumer::weights);
  Tensor y = Tensor::empty(dev, {2, 2}, GetParam().dtype, Consumer::activations);
  Tensor sm = Tensor::empty(dev, {2}, DType::f32, Consumer::activations), sr = sm.clone();
  hr::ops::batchnorm_forward_train(x, g, b, 0.f, 0.25f, rm, rv, y, sm, sr);
  // channel 0: mean 2, unbiased var 2;  channel 1: mean 2, unbiased var 32.
  const std::vector<float> m = rm.to_host_f32(), v = rv.to_host_f32();
  EXPECT_FLOAT_EQ(m[0], 0.75f * 0.5f + 0.25f * 2.f);
  EXPECT_FLOAT_EQ(m[1], 0.25f * 2.f);
  EXPECT_FLOAT_EQ(v[0], 0.75f * 1.f + 0.25f * 2.f);
  EXPECT_FLOAT_EQ(v[1], 0.75f * 2.f + 0.25f * 32.f);
  // The saved rstd normalises with the biased variance (1 and 16).
  EXPECT_FLOAT_EQ(sr.to_host_f32()[0], 1.f);
  EXPECT_FLOAT_EQ(sr.to_host_f32()[1], 0.25f);
}

TEST_P(BatchNormOp, BackwardMatchesFiniteDifferences) {
  HR_TEST_DEVICE(dev, GetParam().backend);
  const DType dt = GetParam().dtype;
  const Case k(5, 3, 11);
  const vecd xs = stored_values(k.x, dt), gs = stored_values(k.g, dt), bs = stored_values(k.b, dt);
  const vecd w = stored_values(k.dy, dt);
  auto loss = [&](const vecd& x, const vecd& g, const vecd& b) {
    vecd rm(static_cast<size_t>(k.C), 0.0), rv(static_cast<size_t>(k.C), 1.0), y;
    hr::ref::batchnorm_forward_train(x, g, b, k.N, k.C, kEps, kMomentum, rm, rv, y);
    return hr::test::dot(w, y);
  };
  const vecd fdx = hr::test::finite_diff_grad([&](const vecd& v) { return loss(v, gs, bs); }, xs);
  const vecd fdg = hr::test::finite_diff_grad([&](const vecd& v) { return loss(xs, v, bs); }, gs);
  const vecd fdb = hr::test::finite_diff_grad([&](const vecd& v) { return loss(xs, gs, v); }, bs);
  Tensor x = Tensor::from_host(dev, k.x, {k.N, k.C}, dt, Consumer::activations);
  Tensor g = Tensor::from_host(dev, k.g, {k.C}, dt, Consumer::weights);
  Tensor b = Tensor::from_host(dev, k.b, {k.C}, dt, Consumer::weights);
  Tensor rm = Tensor::zeros(dev, {k.C}, DType::f32, Consumer::weights), rv = rm.clone();
  Tensor y = Tensor::empty(dev, {k.N, k.C}, dt, Consumer::activations);
  Tensor sm = Tensor::empty(dev, {k.C}, DType::f32, Consumer::activations), sr = sm.clone();
  Tensor dy = Tensor::from_host(dev, k.dy, {k.N, k.C}, dt, Consumer::activations);
  Tensor dx = Tensor::empty(dev, {k.N, k.C}, dt, Consumer::activations);
  Tensor dg = Tensor::zeros(dev, {k.C}, DType::f32, Consumer::gradients), db = dg.clone();
  hr::ops::batchnorm_forward_train(x, g, b, kEps, kMomentum, rm, rv, y, sm, sr);
  hr::ops::batchnorm_backward(dy, x, g, sm, sr, dx, dg, db);
  const double bound = hr::tol::kRowwiseGradNmse(dt);
  EXPECT_TRUE(hr::test::nmse_within(dx.to_host_f32(), fdx, bound, "batchnorm fd dx"));
  EXPECT_TRUE(hr::test::nmse_within(dg.to_host_f32(), fdg, bound, "batchnorm fd dgamma"));
  EXPECT_TRUE(hr::test::nmse_within(db.to_host_f32(), fdb, bound, "batchnorm fd dbeta"));
}

TEST_P(BatchNormOp, RepeatsBitwise) {
  HR_TEST_DEVICE(dev, GetParam().backend);
  const DType dt = GetParam().dtype;
  const Case k(64, 129, 12);
  Tensor x = Tensor::from_host(dev, k.x, {k.N, k.C}, dt, Consumer::activations);
  Tensor g = Tensor::from_host(dev, k.g, {k.C}, dt, Consumer::weights);
  Tensor b = Tensor::from_host(dev, k.b, {k.C}, dt, Consumer::weights);
  Tensor dy = Tensor::from_host(dev, k.dy, {k.N, k.C}, dt, Consumer::activations);
  std::vector<std::vector<uint8_t>> runs[2];
  for (auto& run : runs) {
    Tensor rm = Tensor::from_host(dev, k.rm, {k.C}, DType::f32, Consumer::weights);
    Tensor rv = Tensor::from_host(dev, k.rv, {k.C}, DType::f32, Consumer::weights);
    Tensor y = Tensor::empty(dev, {k.N, k.C}, dt, Consumer::activations), dx = y.clone();
    Tensor sm = Tensor::empty(dev, {k.C}, DType::f32, Consumer::activations), sr = sm.clone();
    Tensor dg = Tensor::zeros(dev, {k.C}, DType::f32, Consumer::gradients), db = dg.clone();
    hr::ops::batchnorm_forward_train(x, g, b, kEps, kMomentum, rm, rv, y, sm, sr);
    hr::ops::batchnorm_backward(dy, x, g, sm, sr, dx, dg, db);
    run = {y.to_host_bytes(), rm.to_host_bytes(), rv.to_host_bytes(), dx.to_host_bytes(), dg.to_host_bytes(),
           db.to_host_bytes()};
  }
  for (size_t i = 0; i < runs[0].size(); ++i) EXPECT_EQ(runs[0][i], runs[1][i]) << "output " << i;
}

TEST_P(BatchNormOp, TrainingRejectsASingleValuePerChannel) {
  HR_TEST_DEVICE(dev, GetParam().backend);
  const DType dt = GetParam().dtype;
  Tensor x = Tensor::zeros(dev, {1, 4}, dt, Consumer::activations);
  Tensor g = Tensor::zeros(dev, {4}, dt, Consumer::weights), b = g.clone();
  Tensor rm = Tensor::zeros(dev, {4}, DType::f32, Consumer::weights), rv = rm.clone(), sm = rm.clone(),
         sr = rm.clone();
  Tensor y = Tensor::empty(dev, {1, 4}, dt, Consumer::activations);
  EXPECT_THROW(hr::ops::batchnorm_forward_train(x, g, b, kEps, kMomentum, rm, rv, y, sm, sr), hr::Error);
}

// gamma and beta in different dtypes: refused (the GPU kernels take one weight type).
TEST_P(BatchNormOp, RejectsGammaAndBetaOfDifferentDTypes) {
  HR_TEST_DEVICE(dev, GetParam().backend);
  const DType dt = GetParam().dtype;
  if (dt == DType::f32) GTEST_SKIP() << "fp32 activations take fp32 weights only: no second dtype to mix";
  Tensor x = Tensor::from_host(dev, hr::test::random_nonzero(16, 2), {4, 4}, dt, Consumer::activations);
  Tensor g32 = Tensor::zeros(dev, {4}, DType::f32, Consumer::weights);
  Tensor b16 = Tensor::zeros(dev, {4}, dt, Consumer::weights);
  Tensor rm = Tensor::zeros(dev, {4}, DType::f32, Consumer::weights), rv = Tensor::from_host(dev, std::vector<float>(4, 1.f), {4}, DType::f32, Consumer::weights),
         sm = rm.clone(), sr = rm.clone();
  Tensor y = Tensor::empty(dev, {4, 4}, dt, Consumer::activations);
  EXPECT_THROW(hr::ops::batchnorm_forward_train(x, g32, b16, kEps, kMomentum, rm, rv, y, sm, sr), hr::Error);
  EXPECT_THROW(hr::ops::batchnorm_forward_eval(x, g32, b16, kEps, rm, rv, y), hr::Error);
  EXPECT_NO_THROW(hr::ops::batchnorm_forward_train(x, g32, g32, kEps, kMomentum, rm, rv, y, sm, sr));
  EXPECT_NO_THROW(hr::ops::batchnorm_forward_eval(x, b16, b16, kEps, rm, rv, y));
}

INSTANTIATE_TEST_SUITE_P(Ops, BatchNormOp, testing::ValuesIn(hr::test::all_backend_dtypes()),
                         hr::test::param_name);

}  // namespace
