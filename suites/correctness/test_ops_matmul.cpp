// OPS-1 / OPS-2 / DET-1 for the matrix products: matmul and matmul_batched in all
// four transpose combinations at edge sizes against a float64 reference (NMSE),
// alpha/beta, sentinels around c, NaN handling; linear forward and backward
// (against float64 central finite differences); bitwise repeatability.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <tuple>
#include <utility>
#include <vector>

#include "harness/check.hpp"
#include "harness/compare.hpp"
#include "harness/tensor.hpp"
#include "kernels/elementwise/elementwise.hpp"
#include "kernels/matmul/matmul.hpp"
#include "kernels/matmul/matmul_ref.hpp"
#include "suites/common/finite_diff.hpp"
#include "suites/common/op_check.hpp"
#include "suites/common/test_support.hpp"
#include "harness/tolerances.hpp"

namespace hr {
namespace {

using test::BackendDType;

class MatmulOps : public testing::TestWithParam<BackendDType> {};

// A random non-zero tensor and the values it actually stores (after rounding).
struct Operand {
  Tensor t;
  std::vector<double> host;
};

Operand random_operand(Device& dev, Shape shape, DType dtype, uint64_t seed, Consumer c = Consumer::activations) {
  Operand o;
  o.t = Tensor::from_host(dev, test::random_nonzero(static_cast<size_t>(shape_numel(shape)), seed), shape, dtype, c);
  o.host = test::widen(o.t.to_host_f32());
  return o;
}

// One product on the device under test against the float64 reference; returns NMSE.
double product_nmse(Device& dev, DType dtype, DType c_dtype, int64_t batch, int64_t m, int64_t n, int64_t k,
                    bool ta, bool tb, float alpha, float beta, uint64_t seed, bool* guards_intact = nullptr) {
  const bool batched = batch > 0;
  const int64_t be = batched ? batch : 1;
  auto shape = [&](int64_t r, int64_t c) { return batched ? Shape{batch, r, c} : Shape{r, c}; };
  Operand a = random_operand(dev, ta ? shape(k, m) : shape(m, k), dtype, seed);
  Operand b = random_operand(dev, tb ? shape(n, k) : shape(k, n), dtype, seed + 1);
  test::Guarded g(dev, shape(m, n), c_dtype);
  // beta == 0 leaves c as the guard's NaN bytes: a product that reads c then fails.
  if (beta != 0.f) g.set(test::random_nonzero(static_cast<size_t>(be * m * n), seed + 2));
  const std::vector<double> c0 = beta != 0.f ? test::widen(g.values()) : std::vector<double>(be * m * n);
  if (batched)
    ops::matmul_batched(a.t, ta, b.t, tb, g.tensor(), alpha, beta);
  else
    ops::matmul(a.t, ta, b.t, tb, g.tensor(), alpha, beta);
  const std::vector<double> want = ref::matmul(a.host, ta, b.host, tb, c0, be, m, n, k, alpha, beta);
  if (guards_intact) *guards_intact = g.guards_intact();
  return test::nmse(g.values(), want);
}

const std::vector<std::tuple<int64_t, int64_t, int64_t>>& edge_sizes() {
  static const std::vector<std::tuple<int64_t, int64_t, int64_t>> s = {
      {1, 1, 1},     {15, 15, 15},   {16, 16, 16},  {17, 17, 17}, {127, 127, 127}, {128, 128, 128},
      {129, 129, 129}, {1, 129, 17}, {129, 1, 16},  {17, 127, 1}, {16, 15, 128},   {128, 17, 129},
      {15, 128, 127}};
  return s;
}

TEST_P(MatmulOps, AllTransposesAtEdgeSizesMatchFloat64Reference) {
  HR_TEST_DEVICE(dev, GetParam().backend);
  const DType dt = GetParam().dtype;
  const double tol = tol::kMatmulNmse(dt);
  uint64_t seed = 100;
  double worst = 0;
  for (auto [m, n, k] : edge_sizes())
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        bool intact = false;
        const double e = product_nmse(dev, dt, dt, 0, m, n, k, ta, tb, 1.f, 0.f, seed += 3, &intact);
        EXPECT_LE(e, tol) << "m " << m << " n " << n << " k " << k << " ta " << ta << " tb " << tb;
        EXPECT_TRUE(intact) << "write outside c at m " << m << " n " << n << " k " << k;
        worst = std::max(worst, e);
      }
  RecordProperty("worst_nmse", fmt::format("{:.3g}", worst));
  RecordProperty("tolerance_nmse", fmt::format("{:.3g}", tol));
}

TEST_P(MatmulOps, Fp32OutputFrom16BitInputsMatchesReference) {
  HR_TEST_DEVICE(dev, GetParam().backend);
  const DType dt = GetParam().dtype;
  // fp32 output: only accumulation error remains, so the fp32 bound applies.
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      const double e = product_nmse(dev, dt, DType::f32, 0, 33, 65, 129, ta, tb, 1.f, 0.f, 7 + ta * 2 + tb);
      EXPECT_LE(e, tol::kMatmulNmse(DType::f32)) << "ta " << ta << " tb " << tb;
    }
}

TEST_P(MatmulOps, LargeProductMatchesFloat64Reference) {
  HR_TEST_DEVICE(dev, GetParam().backend);
  const DType dt = GetParam().dtype;
  // Large enough for the blocked BLAS paths (and several cuBLAS tiles).
  for (bool t : {false, true}) {
    const double e = product_nmse(dev, dt, dt, 0, 515, 1031, 769, t, !t, 1.f, 0.f, 900 + t);
    EXPECT_LE(e, tol::kMatmulNmse(dt)) << "ta " << t;
    RecordProperty(t ? "nmse_tn" : "nmse_nt", fmt::format("{:.3g}", e));
  }
}

TEST_P(MatmulOps, AlphaBetaMatchReference) {
  HR_TEST_DEVICE(dev, GetParam().backend);
  const DType dt = GetParam().dtype;
  for (auto [alpha, beta] : {std::pair{0.75f, -0.5f}, std::pair{-2.f, 1.f}, std::pair{0.f, 0.5f}})
    for (bool ta : {false, true}) {
      bool intact = false;
      const double e = product_nmse(dev, dt, dt, 0, 17, 129, 33, ta, !ta, alpha, beta, 300 + ta, &intact);
      EXPECT_LE(e, tol::kMatmulNmse(dt)) << "alpha " << alpha << " beta " << beta;
      EXPECT_TRUE(intact);
    }
}

TEST_P(MatmulOps, BatchedAllTransposesMatchFloat64Reference) {
  HR_TEST_DEVICE(dev, GetParam().backend);
  const DType dt = GetParam().dtype;
  uint64_t seed = 500;
  for (auto [batch, m, n, k] : {std::tuple<int64_t, int64_t, int64_t, int64_t>{1, 17, 15, 16},
                                {3, 17, 15, 16},
                                {5, 1, 129, 17},
                                {4, 128, 127, 129}})
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        bool intact = false;
        const double e = product_nmse(dev, dt, dt, batch, m, n, k, ta, tb, 1.25f, 0.5f, seed += 3, &intact);
        EXPECT_LE(e, tol::kMatmulNmse(dt)) << "batch " << batch << " m " << m << " ta " << ta << " tb " << tb;
        EXPECT_TRUE(intact);
      }
}

TEST_P(MatmulOps, BetaZeroNeverReadsC) {
  HR_TEST_DEVICE(dev, GetParam().backend);
  const DType dt = GetParam().dtype;
  // BLAS semantics: with beta == 0 a NaN already in c must not reach the result.
  Operand a = random_operand(dev, {19, 23}, dt, 1);
  Operand b = random_operand(dev, {23, 21}, dt, 2);
  Tensor c = Tensor::from_host(dev, std::vector<float>(19 * 21, std::numeric_limits<float>::quiet_NaN()), {19, 21},
                               dt, Consumer::activations);
  ops::matmul(a.t, false, b.t, false, c);
  const auto want = ref::matmul(a.host, false, b.host, false, std::vector<double>(19 * 21), 1, 19, 21, 23);
  EXPECT_LE(test::nmse(c.to_host_f32(), want), tol::kMatmulNmse(dt));
}

TEST_P(MatmulOps, NaNInAnInputNeverPasses) {
  HR_TEST_DEVICE(dev, GetParam().backend);
  const DType dt = GetParam().dtype;
  std::vector<float> av = test::random_nonzero(16 * 16, 11);
  av[37] = std::numeric_limits<float>::quiet_NaN();
  Tensor a = Tensor::from_host(dev, av, {16, 16}, dt, Consumer::activations);
  Operand b = random_operand(dev, {16, 16}, dt, 12);
  Tensor c = Tensor::zeros(dev, {16, 16}, dt, Consumer::activations);
  ops::matmul(a, false, b.t, false, c);
  std::vector<double> a_host = test::widen(a.to_host_f32());
  a_host[37] = 0.0;  // a reference that ignores the NaN
  const auto want = ref::matmul(a_host, false, b.host, false, std::vector<double>(256), 1, 16, 16, 16);
  const double e = test::nmse(c.to_host_f32(), want);
  EXPECT_FALSE(e <= tol::kMatmulNmse(dt)) << "a NaN result passed with error " << e;
}

TEST_P(MatmulOps, WrongTransposeIsCaught) {
  HR_TEST_DEVICE(dev, GetParam().backend);
  const DType dt = GetParam().dtype;
  // Negative control for the comparison itself: the product with b transposed
  // where it should not be is far outside the bound.
  Operand a = random_operand(dev, {31, 31}, dt, 21);
  Operand b = random_operand(dev, {31, 31}, dt, 22);
  Tensor c = Tensor::zeros(dev, {31, 31}, dt, Consumer::activations);
  ops::matmul(a.t, false, b.t, true, c);
  const auto want = ref::matmul(a.host, false, b.host, false, std::vector<double>(31 * 31), 1, 31, 31, 31);
  EXPECT_GT(test::nmse(c.to_host_f32(), want), 100 * tol::kMatmulNmse(dt));
}

TEST_P(MatmulOps, ShapeAndDtypeMismatchesThrow) {
  HR_TEST_DEVICE(dev, GetParam().backend);
  const DType dt = GetParam().dtype;
  Tensor a = Tensor::zeros(dev, {4, 5}, dt, Consumer::workspace);
  Tensor b = Tensor::zeros(dev, {6, 3}, dt, Consumer::workspace);
  Tensor c = Tensor::zeros(dev, {4, 3}, dt, Consumer::workspace);
  EXPECT_THROW(ops::matmul(a, false, b, false, c), Error);  // k 5 against 6
  Tensor b2 = Tensor::zeros(dev, {5, 3}, dt == DType::f32 ? DType::f16 : DType::f32, Consumer::workspace);
  EXPECT_THROW(ops::matmul(a, false, b2, false, c), Error);  // mixed input dtypes
  Tensor a3 = Tensor::zeros(dev, {2, 4, 5}, dt, Consumer::workspace);
  Tensor b3 = Tensor::zeros(dev, {3, 5, 3}, dt, Consumer::workspace);
  Tensor c3 = Tensor::zeros(dev, {2, 4, 3}, dt, Consumer::workspace);
  EXPECT_THROW(ops::matmul_batched(a3, false, b3, false, c3), Error);  // batch 2 against 3
}

TEST_P(MatmulOps, RepeatedProductIsBitwiseIdentical) {
  HR_TEST_DEVICE(dev, GetParam().backend);
  const DType dt = GetParam().dtype;
  Operand a = random_operand(dev, {3, 129, 257}, dt, 41);
  Operand b = random_operand(dev, {3, 257, 130}, dt, 42);
  std::vector<uint8_t> first;
  for (int run = 0; run < 2; ++run) {
    Tensor c = Tensor::zeros(dev, {3, 129, 130}, dt, Consumer::activations);
    ops::matmul_batched(a.t, false, b.t, false, c);
    if (run == 0)
      first = c.to_host_bytes();
    else
      EXPECT_EQ(hr::bitwise_mismatches(first, c.to_host_bytes()), 0u);
  }
}

// ---- linear --------------------------------------------------------------------

TEST_P(MatmulOps, LinearForwardMatchesReference) {
  HR_TEST_DEVICE(dev, GetParam().backend);
  const DType dt = GetParam().dtype;
  // in = 700: long enough for OpenBLAS's x86-64 kernels to split K into panels,
  // where the CPU's fused bias joins the first panel's partial sum.
  for (const auto& [with_bias, in] : {std::pair{true, int64_t{17}}, std::pair{false, int64_t{17}},
                                      std::pair{true, int64_t{700}}}) {
    const int64_t n = 33, out = 129;
    Operand x = random_operand(dev, {n, in}, dt, 61);
    Operand w = random_operand(dev, {out, in}, dt, 62, Consumer::weights);
    Operand b = random_operand(dev, {out}, dt, 63, Consumer::weights);
    // y starts as NaN: a row the fused bias left unset fails, as y is read (beta = 1).
    test::Guarded y(dev, {n, out}, dt);
    ops::linear_forward(x.t, w.t, with_bias ? b.t : Tensor(), y.tensor());
    EXPECT_TRUE(y.guards_intact());
    const auto want = ref::linear(x.host, w.host, with_bias ? b.host : std::vector<double>(), n, in, out);
    // The bias add is a second rounding of y in 16-bit storage: same bound family.
    EXPECT_LE(test::nmse(y.values(), want), tol::kMatmulNmse(dt)) << "bias " << with_bias << ", in " << in;
    if (GetParam().backend == hr::BackendKind::cpu && dt == DType::f32 && with_bias && in == 17) {
      // Within one K panel the CPU's fused bias gives the bits of the product
      // followed by the bias add (kernels/matmul/matmul.hpp).
      Tensor apart = Tensor::empty(dev, {n, out}, dt, Consumer::activations);
      ops::matmul(x.t, false, w.t, true, apart);
      ops::add_bias(apart, b.t);
      EXPECT_EQ(hr::bitwise_mismatches(apart.to_host_bytes(), y.tensor().to_host_bytes()), 0u);
    }
  }
}

// OPS-2: gradients of L = <linear(x, w, b), g> against central finite differences
// of the float64 reference; dw and db start non-zero to check they accumulate.
TEST_P(MatmulOps, LinearBackwardMatchesFiniteDifferences) {
  HR_TEST_DEVICE(dev, GetParam().backend);
  const DType dt = GetParam().dtype;
  const int64_t n = 6, in = 7, out = 5;
  Operand x = random_operand(dev, {n, in}, dt, 71);
  Operand w = random_operand(dev, {out, in}, dt, 72, Consumer::weights);
  Operand b = random_operand(dev, {out}, dt, 73, Consumer::weights);
  Operand g = random_operand(dev, {n, out}, dt, 74);
  Operand dw0 = random_operand(dev, {out, in}, dt, 75, Consumer::gradients);
  Operand db0 = random_operand(dev, {out}, dt, 76, Consumer::gradients);
  Tensor dx = Tensor::from_host(dev, std::vector<float>(n * in, std::numeric_limits<float>::quiet_NaN()), {n, in}, dt,
                                Consumer::activations);  // overwritten, never read
  Tensor dw = dw0.t.clone(), db = db0.t.clone();
  ops::linear_backward(x.t, w.t, g.t, dx, dw, db);

  auto loss = [&](const std::vector<double>& xv, const std::vector<double>& wv, const std::vector<double>& bv) {
    return test::dot(ref::linear(xv, wv, bv, n, in, out), g.host);
  };
  const auto gx = test::finite_diff_grad([&](const std::vector<double>& v) { return loss(v, w.host, b.host); }, x.host);
  auto gw = test::finite_diff_grad([&](const std::vector<double>& v) { return loss(x.host, v, b.host); }, w.host);
  auto gb = test::finite_diff_grad([&](const std::vector<double>& v) { return loss(x.host, w.host, v); }, b.host);
  for (size_t i = 0; i < gw.size(); ++i) gw[i] += dw0.host[i];
  for (size_t i = 0; i < gb.size(); ++i) gb[i] += db0.host[i];
  const double tol = tol::kMatmulGradNmse(dt);
  EXPECT_TRUE(test::nmse_within(dx.to_host_f32(), gx, tol, "dx"));
  EXPECT_TRUE(test::nmse_within(dw.to_host_f32(), gw, tol, "dw (accumulated)"));
  EXPECT_TRUE(test::nmse_within(db.to_host_f32(), gb, tol, "db (accumulated)"));

  // Skipping dx and db leaves them alone; dw accumulates a second time.
  Tensor none;
  ops::linear_backward(x.t, w.t, g.t, none, dw, none);
  for (size_t i = 0; i < gw.size(); ++i) gw[i] += gw[i] - dw0.host[i];
  EXPECT_TRUE(test::nmse_within(dw.to_host_f32(), gw, tol, "dw after a second accumulation"));

  // A frozen weight (undefined dw) still passes the input gradient through, bitwise
  // as with dw, and allocates nothing for the weight gradient.
  Tensor dx_frozen = Tensor::empty(dev, {n, in}, dt, Consumer::activations);
  const size_t grads_before = dev.memory().snapshot().current(Consumer::gradients);
  ops::linear_backward(x.t, w.t, g.t, dx_frozen, none, none);
  EXPECT_EQ(dev.memory().snapshot().current(Consumer::gradients), grads_before);
  EXPECT_EQ(hr::bitwise_mismatches(dx_frozen.to_host_bytes(), dx.to_host_bytes()), 0u);

  // DxWrite::accumulate adds dy w to what dx holds (an input read by several layers).
  Operand dx0 = random_operand(dev, {n, in}, dt, 77);
  Tensor dx_acc = dx0.t.clone();
  ops::linear_backward(x.t, w.t, g.t, dx_acc, none, none, ops::DxWrite::accumulate);
  std::vector<double> gx_acc = gx;
  for (size_t i = 0; i < gx_acc.size(); ++i) gx_acc[i] += dx0.host[i];
  EXPECT_TRUE(test::nmse_within(dx_acc.to_host_f32(), gx_acc, tol, "dx (accumulated)"));
}

TEST_P(MatmulOps, LinearBackwardIsBitwiseRepeatable) {
  HR_TEST_DEVICE(dev, GetParam().backend);
  const DType dt = GetParam().dtype;
  Operand x = random_operand(dev, {64, 48}, dt, 81);
  Operand w = random_operand(dev, {40, 48}, dt, 82, Consumer::weights);
  Operand dy = random_operand(dev, {64, 40}, dt, 83);
  std::vector<std::vector<uint8_t>> first;
  for (int run = 0; run < 2; ++run) {
    Tensor dx = Tensor::empty(dev, {64, 48}, dt, Consumer::activations);
    Tensor dw = Tensor::zeros(dev, {40, 48}, dt, Consumer::gradients);
    Tensor db = Tensor::zeros(dev, {40}, dt, Consumer::gradients);
    ops::linear_backward(x.t, w.t, dy.t, dx, dw, db);
    std::vector<std::vector<uint8_t>> now = {dx.to_host_bytes(), dw.to_host_bytes(), db.to_host_bytes()};
    if (run == 0)
      first = now;
    else
      for (size_t i = 0; i < now.size(); ++i) EXPECT_EQ(hr::bitwise_mismatches(first[i], now[i]), 0u) << "tensor " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, MatmulOps, testing::ValuesIn(test::all_backend_dtypes()), test::param_name);

}  // namespace
}  // namespace hr
