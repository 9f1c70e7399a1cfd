// OPS-1 and DET-1 for the element-wise ops (add, scale, axpy, cast, fill,
// add_bias, bias_grad) on every backend x dtype: float64 reference by NMSE at the
// edge sizes, sentinel bytes around every output, bitwise repeatability, and the
// negative controls showing a NaN or a wrong result cannot pass.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "harness/check.hpp"
#include "kernels/common/float16.hpp"
#include "kernels/elementwise/elementwise.hpp"
#include "kernels/elementwise/elementwise_ref.hpp"
#include "suites/common/op_check.hpp"
#include "harness/tolerances.hpp"
#include "suites/common/test_support.hpp"

namespace {

using hr::Consumer;
using hr::DType;
using hr::Tensor;
using hr::test::Guarded;
using hr::test::stored_values;


class OpsElementwise : public testing::TestWithParam<hr::test::BackendDType> {
 protected:
  DType dtype() const { return GetParam().dtype; }
  double bound() const { return hr::tol::kElementwiseNmse(dtype()); }
  Tensor input(hr::Device& dev, int64_t n, uint64_t seed) const {
    return Tensor::from_host(dev, hr::test::random_nonzero(static_cast<size_t>(n), seed), {n}, dtype(),
                             Consumer::activations);
  }
  // Checks one output against its reference and its guards; keeps the worst NMSE.
  void check(Guarded& out, const std::vector<double>& ref, const std::string& what, double bound) {
    const std::vector<float> got = out.values();
    EXPECT_TRUE(hr::test::nmse_within(got, ref, bound, what));
    EXPECT_TRUE(out.guards_intact()) << what;
    worst_ = std::max(worst_, hr::test::nmse(got, ref));
  }
  void check(Guarded& out, const std::vector<double>& ref, const std::string& what) {
    check(out, ref, what, bound());
  }
  void TearDown() override { RecordProperty("max_nmse", fmt::format("{:.3e}", worst_)); }
  double worst_ = 0;
};

TEST_P(OpsElementwise, AddMatchesFloat64Reference) {
  HR_TEST_DEVICE(dev, GetParam().backend);
  for (int64_t n : hr::test::edge_sizes()) {
    const Tensor a = input(dev, n, 1 + n), b = input(dev, n, 2 + n);
    Guarded out(dev, {n}, dtype());
    hr::ops::add(a, b, out.tensor());
    check(out, hr::ref::add(stored_values(a), stored_values(b)), "add n=" + std::to_string(n));
  }
}

TEST_P(OpsElementwise, AddInPlaceEqualsOutOfPlace) {
  HR_TEST_DEVICE(dev, GetParam().backend);
  const int64_t n = 4097;
  Tensor a = input(dev, n, 3), b = input(dev, n, 4);
  Tensor out = Tensor::empty(dev, {n}, dtype(), Consumer::activations);
  hr::ops::add(a, b, out);
  hr::ops::add(a, b, a);
  EXPECT_EQ(a.to_host_bytes(), out.to_host_bytes());
}

TEST_P(OpsElementwise, ScaleMatchesFloat64Reference) {
  HR_TEST_DEVICE(dev, GetParam().backend);
  const float alpha = -0.37f;
  for (int64_t n : hr::test::edge_sizes()) {
    const Tensor x = input(dev, n, 5 + n);
    Guarded out(dev, {n}, dtype());
    hr::ops::scale(x, alpha, out.tensor());
    check(out, hr::ref::scale(stored_values(x), alpha), "scale n=" + std::to_string(n));
  }
}

TEST_P(OpsElementwise, AxpyMatchesFloat64Reference) {
  HR_TEST_DEVICE(dev, GetParam().backend);
  const float alpha = 0.61f;
  for (int64_t n : hr::test::edge_sizes()) {
    const Tensor x = input(dev, n, 6 + n);
    Guarded y(dev, {n}, dtype(), 64, Consumer::gradients);
    y.set(hr::test::random_nonzero(static_cast<size_t>(n), 7 + n));
    const std::vector<double> y0 = stored_values(y.tensor());
    hr::ops::axpy(alpha, x, y.tensor());
    check(y, hr::ref::axpy(alpha, stored_values(x), y0), "axpy n=" + std::to_string(n));
  }
}

TEST_P(OpsElementwise, AxpyAccumulatesAnyDtypeIntoFp32) {
  // Mixed precision: 16-bit micro-batch gradients accumulate into fp32 buffers.
  HR_TEST_DEVICE(dev, GetParam().backend);
  const int64_t n = 4097;
  const Tensor x = input(dev, n, 8);
  Guarded y(dev, {n}, DType::f32, 64, Consumer::gradients);
  y.set(hr::test::random_nonzero(static_cast<size_t>(n), 9));
  const std::vector<double> y0 = stored_values(y.tensor());
  hr::ops::axpy(2.f, x, y.tensor());
  check(y, hr::ref::axpy(2.0, stored_values(x), y0), "axpy into fp32", hr::tol::kElementwiseNmse(DType::f32));
}

TEST_P(OpsElementwise, CastRoundsOnceAndWidensExactly) {
  HR_TEST_DEVICE(dev, GetParam().backend);
  for (int64_t n : hr::test::edge_sizes()) {
    const std::vector<float> v = hr::test::random_nonzero(static_cast<size_t>(n), 10 + n, -4.f, 4.f);
    const Tensor x32 = Tensor::from_host(dev, v, {n}, DType::f32, Consumer::activations);
    Guarded narrow(dev, {n}, dtype());
    hr::ops::cast(x32, narrow.tensor());
    check(narrow, hr::test::widen(v), "cast to dtype n=" + std::to_string(n));
    // Widening back is exact: fp32 holds every fp16 / bf16 value.
    Guarded wide(dev, {n}, DType::f32);
    hr::ops::cast(narrow.tensor(), wide.tensor());
    EXPECT_EQ(wide.tensor().to_host_f32(), narrow.tensor().to_host_f32()) << "n=" << n;
    EXPECT_TRUE(wide.guards_intact());
  }
}

TEST_P(OpsElementwise, FillWritesEveryElementRounded) {
  HR_TEST_DEVICE(dev, GetParam().backend);
  for (int64_t n : hr::test::edge_sizes()) {
    Guarded out(dev, {n}, dtype());
    hr::ops::fill(out.tensor(), 0.3f);
    const float expect = hr::test::stored_values(Tensor::from_host(dev, {0.3f}, {1}, dtype(), Consumer::workspace))[0];
    const std::vector<float> got = out.tensor().to_host_f32();
    EXPECT_EQ(std::count(got.begin(), got.end(), expect), n) << "n=" << n;
    EXPECT_TRUE(out.guards_intact());
  }
}

// [rows, cols] shapes: every edge size as the column count, plus one large.
std::vector<std::pair<int64_t, int64_t>> bias_shapes() {
  std::vector<std::pair<int64_t, int64_t>> v;
  for (int64_t c : hr::test::edge_sizes())
    if (c < 100000) v.push_back({3, c});
  v.push_back({4096, 256});
  v.push_back({129, 17});
  return v;
}

TEST_P(OpsElementwise, AddBiasMatchesFloat64Reference) {
  HR_TEST_DEVICE(dev, GetParam().backend);
  for (auto [rows, cols] : bias_shapes()) {
    Guarded y(dev, {rows, cols}, dtype());
    y.set(hr::test::random_nonzero(static_cast<size_t>(rows * cols), 11 + cols));
    const Tensor bias = input(dev, cols, 12 + cols);
    const std::vector<double> y0 = stored_values(y.tensor());
    hr::ops::add_bias(y.tensor(), bias);
    check(y, hr::ref::add_bias(y0, stored_values(bias)), fmt::format("add_bias [{}, {}]", rows, cols));
  }
}

TEST_P(OpsElementwise, BiasGradAccumulatesColumnSums) {
  HR_TEST_DEVICE(dev, GetParam().backend);
  for (auto [rows, cols] : bias_shapes()) {
    const Tensor dy = Tensor::from_host(dev, hr::test::random_nonzero(static_cast<size_t>(rows * cols), 13 + cols),
                                        {rows, cols}, dtype(), Consumer::activations);
    Guarded dbias(dev, {cols}, dtype(), 64, Consumer::gradients);
    dbias.set(hr::test::random_nonzero(static_cast<size_t>(cols), 14 + cols));
    const std::vector<double> b0 = stored_values(dbias.tensor());
    hr::ops::bias_grad(dy, dbias.tensor());
    // A column sum of `rows` fp32 terms, stored once: the reduction class.
    check(dbias, hr::ref::bias_grad(stored_values(dy), b0), fmt::format("bias_grad [{}, {}]", rows, cols),
          hr::tol::kSumNmse(dtype()));
  }
}

TEST_P(OpsElementwise, UnalignedViewsMatchTheReference) {
  // Views that start one element into their storage cannot use 16-byte packs: the
  // kernels must notice and take the scalar path, touching nothing outside.
  HR_TEST_DEVICE(dev, GetParam().backend);
  const int64_t n = 4097;
  const Tensor a = input(dev, n + 1, 23).slice(1, n + 1), b = input(dev, n + 2, 24).slice(2, n + 2);
  Guarded out(dev, {n + 1}, dtype());
  Tensor view = out.tensor().slice(1, n + 1);
  hr::ops::add(a, b, view);
  hr::ops::axpy(0.5f, a, view);
  const std::vector<double> want = hr::ref::axpy(0.5, stored_values(a), hr::ref::add(stored_values(a), stored_values(b)));
  std::vector<float> got = out.values();
  EXPECT_TRUE(std::isnan(got[0])) << "the element before the view was written";
  got.erase(got.begin());
  // Two stored results (add, then axpy): twice the one-store bound.
  EXPECT_TRUE(hr::test::nmse_within(got, want, 2 * bound(), "add then axpy on unaligned views"));
  EXPECT_TRUE(out.guards_intact());
}

TEST_P(OpsElementwise, SameInputsGiveBitwiseIdenticalOutputs) {
  // DET-1 for every op of the family, including the two-pass bias gradient.
  HR_TEST_DEVICE(dev, GetParam().backend);
  const int64_t rows = 1000, cols = 129, n = rows * cols;
  const Tensor a = Tensor::from_host(dev, hr::test::random_nonzero(n, 15), {rows, cols}, dtype(), Consumer::activations);
  const Tensor b = Tensor::from_host(dev, hr::test::random_nonzero(n, 16), {rows, cols}, dtype(), Consumer::activations);
  const Tensor bias = input(dev, cols, 17);
  auto run = [&] {
    std::vector<std::vector<uint8_t>> out;
    Tensor t = Tensor::empty(dev, {rows, cols}, dtype(), Consumer::activations);
    hr::ops::add(a, b, t);
    hr::ops::scale(t, 1.7f, t);
    hr::ops::axpy(-0.3f, a, t);
    hr::ops::add_bias(t, bias);
    out.push_back(t.to_host_bytes());
    Tensor db = Tensor::zeros(dev, {cols}, dtype(), Consumer::gradients);
    hr::ops::bias_grad(t, db);
    out.push_back(db.to_host_bytes());
    return out;
  };
  EXPECT_EQ(run(), run());
}

TEST_P(OpsElementwise, NaNInTheOutputNeverPasses) {
  // Negative control: a NaN that reaches the output fails the same comparison the
  // conformance tests use, however loose the bound.
  HR_TEST_DEVICE(dev, GetParam().backend);
  const int64_t n = 129;
  std::vector<float> va = hr::test::random_nonzero(n, 18);
  const Tensor b = input(dev, n, 19);
  const std::vector<double> ref =
      hr::ref::add(stored_values(Tensor::from_host(dev, va, {n}, dtype(), Consumer::workspace)), stored_values(b));
  va[64] = std::nanf("");
  const Tensor a = Tensor::from_host(dev, va, {n}, dtype(), Consumer::activations);
  Tensor out = Tensor::empty(dev, {n}, dtype(), Consumer::activations);
  hr::ops::add(a, b, out);
  EXPECT_TRUE(std::isnan(out.to_host_f32()[64]));
  EXPECT_FALSE(hr::test::nmse_within(out.to_host_f32(), ref, 1e30, "add with a NaN input"));
}

TEST_P(OpsElementwise, WrongResultFailsTheBound) {
  // Negative control: a 1% error everywhere fails every dtype's bound.
  HR_TEST_DEVICE(dev, GetParam().backend);
  const int64_t n = 4097;
  const Tensor x = input(dev, n, 20);
  Tensor out = Tensor::empty(dev, {n}, dtype(), Consumer::activations);
  hr::ops::scale(x, 1.01f, out);
  EXPECT_FALSE(hr::test::nmse_within(out.to_host_f32(), stored_values(x), bound(), "scale by 1.01"));
}

TEST_P(OpsElementwise, ShapeMismatchThrows) {
  HR_TEST_DEVICE(dev, GetParam().backend);
  const Tensor a = input(dev, 16, 21), b = input(dev, 17, 22);
  Tensor out = Tensor::empty(dev, {16}, dtype(), Consumer::activations);
  EXPECT_THROW(hr::ops::add(a, b, out), hr::Error);
  Tensor y = Tensor::empty(dev, {4, 4}, dtype(), Consumer::activations);
  EXPECT_THROW(hr::ops::add_bias(y, b), hr::Error);
}

INSTANTIATE_TEST_SUITE_P(AllBackends, OpsElementwise, testing::ValuesIn(hr::test::all_backend_dtypes()),
                         hr::test::param_name);

TEST(OpsCompare, NmseNeverPassesNaNOrInf) {
  using hr::test::nmse;
  EXPECT_TRUE(std::isnan(nmse({1.f, std::nanf("")}, {1.0, 2.0})));
  EXPECT_FALSE(nmse({1.f, -INFINITY}, {1.0, INFINITY}) <= 1e30);
  EXPECT_TRUE(std::isinf(nmse({1.f, INFINITY}, {1.0, 2.0})));
  EXPECT_TRUE(std::isinf(nmse({1.f}, {0.0})));
  EXPECT_EQ(nmse({0.f}, {0.0}), 0.0);
  EXPECT_NEAR(nmse({1.1f}, {1.0}), 0.01, 1e-7);
}

TEST(OpsCompare, NmsePassesInfOnlyWhereTheReferenceHasTheSameInf) {
  using hr::test::nmse;
  EXPECT_NEAR(nmse({INFINITY, 1.1f}, {INFINITY, 1.0}), 0.01, 1e-7);
  EXPECT_TRUE(std::isinf(nmse({1.f, 1.f}, {INFINITY, 1.0})));
  EXPECT_TRUE(std::isinf(nmse({-INFINITY, 1.f}, {INFINITY, 1.0})));
  EXPECT_FALSE(nmse({std::nanf(""), 1.f}, {INFINITY, 1.0}) <= 1e30);
}

}  // namespace
