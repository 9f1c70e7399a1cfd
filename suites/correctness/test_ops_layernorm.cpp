// LayerNorm conformance: forward and backward against the float64 reference
// (OPS-1), backward against finite differences of the reference forward (OPS-2),
// bitwise repeatability (DET-1) and += accumulation of dgamma / dbeta.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "harness/check.hpp"
#include "kernels/layernorm/layernorm.hpp"
#include "kernels/layernorm/layernorm_ref.hpp"
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
const int64_t kEdgeC[] = {1, 15, 16, 17, 127, 128, 129, 4097};

class LayerNormOp : public testing::TestWithParam<hr::test::BackendDType> {};

// Inputs of one case: x with a non-zero mean, gamma around 1, beta around 0.
struct Case {
  int64_t N, C;
  std::vector<float> x, g, b, dy;
  Case(int64_t n, int64_t c, uint64_t seed) : N(n), C(c) {
    x = hr::test::random_nonzero(static_cast<size_t>(N * C), seed, -1.5f, 2.5f);
    g = hr::test::random_nonzero(static_cast<size_t>(C), seed + 1, 0.5f, 1.5f);
    b = hr::test::random_nonzero(static_cast<size_t>(C), seed + 2, -0.5f, 0.5f);
    dy = hr::test::random_nonzero(static_cast<size_t>(N * C), seed + 3);
  }
};

TEST_P(LayerNormOp, ForwardAndBackwardMatchFloat64Reference) {
  HR_TEST_DEVICE(dev, GetParam().backend);
  const DType dt = GetParam().dtype;
  const double bound = hr::tol::kRowwiseNmse(dt);
  for (int64_t C : kEdgeC) {
    for (DType wdt : {dt, DType::f32}) {  // gamma/beta in the activation dtype or fp32 master weights
      const Case k(C == 4097 ? 5 : 9, C, 100 + C);
      const std::string what = "C=" + std::to_string(C) + " w=" + hr::dtype_name(wdt);
      Tensor x = Tensor::from_host(dev, k.x, {k.N, C}, dt, Consumer::activations);
      Tensor g = Tensor::from_host(dev, k.g, {C}, wdt, Consumer::weights);
      Tensor b = Tensor::from_host(dev, k.b, {C}, wdt, Consumer::weights);
      Tensor dy = Tensor::from_host(dev, k.dy, {k.N, C}, dt, Consumer::activations);
      Guarded y(dev, {k.N, C}, dt), mean(dev, {k.N}, DType::f32), rstd(dev, {k.N}, DType::f32);
      hr::ops::layernorm_forward(x, g, b, kEps, y.tensor(), mean.tensor(), rstd.tensor());

      vecd ry, rm, rr;
      const vecd xs = stored_values(k.x, dt), gs = stored_values(k.g, wdt), bs = stored_values(k.b, wdt);
      hr::ref::layernorm_forward(xs, gs, bs, k.N, C, kEps, ry, rm, rr);
      EXPECT_TRUE(hr::test::nmse_within(y.values(), ry, bound, "layernorm y " + what));
      EXPECT_TRUE(hr::test::nmse_within(mean.values(), rm, hr::tol::kRowwiseNmse(DType::f32), "mean " + what));
      EXPECT_TRUE(hr::test::nmse_within(rstd.values(), rr, hr::tol::kRowwiseNmse(DType::f32), "rstd " + what));

      Guarded dx(dev, {k.N, C}, dt), dg(dev, {C}, DType::f32), db(dev, {C}, DType::f32);
      dg.set(std::vector<float>(static_cast<size_t>(C), 0.f));
      db.set(std::vector<float>(static_cast<size_t>(C), 0.f));
      hr::ops::layernorm_backward(dy, x, g, mean.tensor(), rstd.tensor(), dx.tensor(), dg.tensor(), db.tensor());
      vecd rdx, rdg, rdb;
      hr::ref::layernorm_backward(stored_values(k.dy, dt), xs, gs, k.N, C, kEps, rdx, rdg, rdb);
      EXPECT_TRUE(hr::test::nmse_within(dx.values(), rdx, bound, "layernorm dx " + what));
      // dgamma / dbeta are fp32 sums of N products: only fp32 arithmetic separates them from the reference.
      EXPECT_TRUE(hr::test::nmse_within(dg.values(), rdg, hr::tol::kRowwiseNmse(DType::f32), "dgamma " + what));
      EXPECT_TRUE(hr::test::nmse_within(db.values(), rdb, hr::tol::kRowwiseNmse(DType::f32), "dbeta " + what));
      for (Guarded* o : {&y, &mean, &rstd, &dx, &dg, &db}) EXPECT_TRUE(o->guards_intact()) << what;
    }
  }
}

TEST_P(LayerNormOp, BackwardMatchesFiniteDifferences) {
  HR_TEST_DEVICE(dev, GetParam().backend);
  const DType dt = GetParam().dtype;
  for (int64_t C : {1, 7, 33}) {
    const Case k(3, C, 7 + C);
    const vecd xs = stored_values(k.x, dt), gs = stored_values(k.g, dt), bs = stored_values(k.b, dt);
    const vecd w = stored_values(k.dy, dt);  // L = sum(w * y), so dL/dy = w
    auto loss = [&](const vecd& x, const vecd& g, const vecd& b) {
      vecd y, m, r;
      hr::ref::layernorm_forward(x, g, b, k.N, C, kEps, y, m, r);
      return hr::test::dot(w, y);
    };
    const vecd fdx = hr::test::finite_diff_grad([&](const vecd& v) { return loss(v, gs, bs); }, xs);
    const vecd fdg = hr::test::finite_diff_grad([&](const vecd& v) { return loss(xs, v, bs); }, gs);
    const vecd fdb = hr::test::finite_diff_grad([&](const vecd& v) { return loss(xs, gs, v); }, bs);

    Tensor x = Tensor::from_host(dev, k.x, {k.N, C}, dt, Consumer::activations);
    Tensor g = Tensor::from_host(dev, k.g, {C}, dt, Consumer::weights);
    Tensor b = Tensor::from_host(dev, k.b, {C}, dt, Consumer::weights);
    Tensor dy = Tensor::from_host(dev, k.dy, {k.N, C}, dt, Consumer::activations);
    Tensor y = Tensor::empty(dev, {k.N, C}, dt, Consumer::activations);
    Tensor mean = Tensor::empty(dev, {k.N}, DType::f32, Consumer::activations);
    Tensor rstd = Tensor::empty(dev, {k.N}, DType::f32, Consumer::activations);
    Tensor dx = Tensor::empty(dev, {k.N, C}, dt, Consumer::activations);
    Tensor dg = Tensor::zeros(dev, {C}, DType::f32, Consumer::gradients);
    Tensor db = Tensor::zeros(dev, {C}, DType::f32, Consumer::gradients);
    hr::ops::layernorm_forward(x, g, b, kEps, y, mean, rstd);
    hr::ops::layernorm_backward(dy, x, g, mean, rstd, dx, dg, db);
    const double bound = hr::tol::kRowwiseGradNmse(dt);
    const std::string what = " C=" + std::to_string(C);
    EXPECT_TRUE(hr::test::nmse_within(dx.to_host_f32(), fdx, bound, "layernorm fd dx" + what));
    EXPECT_TRUE(hr::test::nmse_within(dg.to_host_f32(), fdg, bound, "layernorm fd dgamma" + what));
    EXPECT_TRUE(hr::test::nmse_within(db.to_host_f32(), fdb, bound, "layernorm fd dbeta" + what));
  }
}

TEST_P(LayerNormOp, RepeatsBitwiseAndAccumulatesParameterGradients) {
  HR_TEST_DEVICE(dev, GetParam().backend);
  const DType dt = GetParam().dtype;
  const Case k(33, 129, 5);
  Tensor x = Tensor::from_host(dev, k.x, {k.N, k.C}, dt, Consumer::activations);
  Tensor g = Tensor::from_host(dev, k.g, {k.C}, dt, Consumer::weights);
  Tensor b = Tensor::from_host(dev, k.b, {k.C}, dt, Consumer::weights);
  Tensor dy = Tensor::from_host(dev, k.dy, {k.N, k.C}, dt, Consumer::activations);
  Tensor dg = Tensor::zeros(dev, {k.C}, DType::f32, Consumer::gradients);
  Tensor db = Tensor::zeros(dev, {k.C}, DType::f32, Consumer::gradients);
  std::vector<std::vector<uint8_t>> runs[2];
  for (auto& run : runs) {
    Tensor y = Tensor::empty(dev, {k.N, k.C}, dt, Consumer::activations);
    Tensor mean = Tensor::empty(dev, {k.N}, DType::f32, Consumer::activations);
    Tensor rstd = Tensor::empty(dev, {k.N}, DType::f32, Consumer::activations);
    Tensor dx = Tensor::empty(dev, {k.N, k.C}, dt, Consumer::activations);
    hr::ops::layernorm_forward(x, g, b, kEps, y, mean, rstd);
    hr::ops::layernorm_backward(dy, x, g, mean, rstd, dx, dg, db);
    run = {y.to_host_bytes(), mean.to_host_bytes(), rstd.to_host_bytes(), dx.to_host_bytes(), dg.to_host_bytes(),
           db.to_host_bytes()};
  }
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(runs[0][i], runs[1][i]) << "output " << i << " differs between runs";
  // Two backward passes into zeroed dgamma / dbeta: g, then g + g == 2g exactly.
  const std::vector<float> g1 = [&] {
    std::vector<float> v(k.C);
    std::memcpy(v.data(), runs[0][4].data(), v.size() * 4);
    return v;
  }();
  const std::vector<float> g2 = dg.to_host_f32();
  double norm = 0;
  for (size_t c = 0; c < g1.size(); ++c) {
    EXPECT_EQ(g2[c], 2.f * g1[c]) << "dgamma[" << c << "] was overwritten, not accumulated";
    norm += g1[c] * g1[c];
  }
  EXPECT_GT(norm, 0.0);
}

TEST_P(LayerNormOp, RejectsMismatchedShapes) {
  HR_TEST_DEVICE(dev, GetParam().backend);
  const DType dt = GetParam().dtype;
  Tensor x = Tensor::zeros(dev, {4, 8}, dt, Consumer::activations);
  Tensor g = Tensor::zeros(dev, {7}, dt, Consumer::weights);
  Tensor b = Tensor::zeros(dev, {8}, dt, Consumer::weights);
  Tensor y = Tensor::empty(dev, {4, 8}, dt, Consumer::activations);
  Tensor m = Tensor::empty(dev, {4}, DType::f32, Consumer::activations);
  Tensor r = Tensor::empty(dev, {4}, DType::f32, Consumer::activations);
  EXPECT_THROW(hr::ops::layernorm_forward(x, g, b, kEps, y, m, r), hr::Error);
}

// gamma and beta in different dtypes (fp32 gamma, 16-bit beta): the GPU kernels
// would read beta as gamma's type, so the op refuses the pair on every backend.
TEST_P(LayerNormOp, RejectsGammaAndBetaOfDifferentDTypes) {
  HR_TEST_DEVICE(dev, GetParam().backend);
  const DType dt = GetParam().dtype;
  if (dt == DType::f32) GTEST_SKIP() << "fp32 activations take fp32 weights only: no second dtype to mix";
  Tensor x = Tensor::from_host(dev, hr::test::random_nonzero(32, 1), {4, 8}, dt, Consumer::activations);
  Tensor g = Tensor::zeros(dev, {8}, DType::f32, Consumer::weights);
  Tensor b = Tensor::zeros(dev, {8}, dt, Consumer::weights);
  Tensor y = Tensor::empty(dev, {4, 8}, dt, Consumer::activations);
  Tensor m = Tensor::empty(dev, {4}, DType::f32, Consumer::activations);
  Tensor r = Tensor::empty(dev, {4}, DType::f32, Consumer::activations);
  EXPECT_THROW(hr::ops::layernorm_forward(x, g, b, kEps, y, m, r), hr::Error);
  EXPECT_THROW(hr::ops::layernorm_forward(x, b, g, kEps, y, m, r), hr::Error);
  EXPECT_NO_THROW(hr::ops::layernorm_forward(x, g, g, kEps, y, m, r));  // fp32 pair: fine
  EXPECT_NO_THROW(hr::ops::layernorm_forward(x, b, b, kEps, y, m, r));  // 16-bit pair: fine
}

INSTANTIATE_TEST_SUITE_P(Ops, LayerNormOp, testing::ValuesIn(hr::test::all_backend_dtypes()),
                         hr::test::param_name);

}  // namespace
