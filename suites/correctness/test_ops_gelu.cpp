// OPS-1, OPS-2 and DET-1 for GELU (tanh form) on every backend x dtype: forward and
// backward against the float64 reference at the edge sizes, backward against
// float64 central finite differences of the reference forward, sentinel bytes,
// bitwise repeatability, and a wrong derivative that the same check must catch.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "harness/check.hpp"
#include "kernels/gelu/gelu.hpp"
#include "kernels/gelu/gelu_ref.hpp"
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

class OpsGelu : public testing::TestWithParam<hr::test::BackendDType> {
 protected:
  DType dtype() const { return GetParam().dtype; }
  double bound() const { return hr::tol::kElementwiseNmse(dtype()); }
  // Inputs over [-4, 4]: both tails and the curved middle of GELU.
  Tensor input(hr::Device& dev, int64_t n, uint64_t seed, float lo = -4.f, float hi = 4.f) const {
    return Tensor::from_host(dev, hr::test::random_nonzero(static_cast<size_t>(n), seed, lo, hi), {n}, dtype(),
                             Consumer::activations);
  }
  void expect_close(Guarded& out, const std::vector<double>& ref, const std::string& what) {
    const std::vector<float> got = out.values();
    EXPECT_TRUE(hr::test::nmse_within(got, ref, bound(), what));
    EXPECT_TRUE(out.guards_intact()) << what;
    worst_ = std::max(worst_, hr::test::nmse(got, ref));
  }
  void TearDown() override { RecordProperty("max_nmse", fmt::format("{:.3e}", worst_)); }
  double worst_ = 0;
};

TEST_P(OpsGelu, ForwardMatchesFloat64Reference) {
  HR_TEST_DEVICE(dev, GetParam().backend);
  for (int64_t n : hr::test::edge_sizes()) {
    const Tensor x = input(dev, n, 100 + n);
    Guarded y(dev, {n}, dtype());
    hr::ops::gelu_forward(x, y.tensor());
    expect_close(y, hr::ref::gelu_forward(stored_values(x)), "gelu_forward n=" + std::to_string(n));
  }
}

TEST_P(OpsGelu, BackwardMatchesFloat64Reference) {
  HR_TEST_DEVICE(dev, GetParam().backend);
  for (int64_t n : hr::test::edge_sizes()) {
    const Tensor x = input(dev, n, 200 + n), dy = input(dev, n, 300 + n, -1.f, 1.f);
    Guarded dx(dev, {n}, dtype());
    hr::ops::gelu_backward(x, dy, dx.tensor());
    expect_close(dx, hr::ref::gelu_backward(stored_values(x), stored_values(dy)),
                 "gelu_backward n=" + std::to_string(n));
  }
}

// d/dx_i of L(x) = sum_j dy_j gelu(x_j), by central differences of the reference.
std::vector<double> fd_gelu_grad(const std::vector<double>& x, const std::vector<double>& dy) {
  return hr::test::finite_diff_grad(
      [&](const std::vector<double>& xs) { return hr::test::dot(dy, hr::ref::gelu_forward(xs)); }, x);
}

TEST_P(OpsGelu, BackwardMatchesFiniteDifferences) {
  // OPS-2.
  HR_TEST_DEVICE(dev, GetParam().backend);
  for (int64_t n : {int64_t{1}, int64_t{17}, int64_t{129}, int64_t{257}}) {
    const Tensor x = input(dev, n, 400 + n), dy = input(dev, n, 500 + n, -1.f, 1.f);
    Guarded dx(dev, {n}, dtype());
    hr::ops::gelu_backward(x, dy, dx.tensor());
    expect_close(dx, fd_gelu_grad(stored_values(x), stored_values(dy)), "gelu_backward vs FD n=" + std::to_string(n));
  }
}

TEST_P(OpsGelu, DerivativeWithoutTheTanhTermFailsFiniteDifferences) {
  // Negative control for OPS-2: dropping the 0.5 x sech^2(u) u' term (a plausible
  // slip) stays far outside the bound of every dtype.
  HR_TEST_DEVICE(dev, GetParam().backend);
  const int64_t n = 257;
  const Tensor x = input(dev, n, 600), dy = input(dev, n, 601, -1.f, 1.f);
  const std::vector<double> xs = stored_values(x), dys = stored_values(dy);
  std::vector<float> wrong(static_cast<size_t>(n));
  for (size_t i = 0; i < wrong.size(); ++i) {
    const double t = std::tanh(0.7978845608028654 * (xs[i] + 0.044715 * xs[i] * xs[i] * xs[i]));
    wrong[i] = static_cast<float>(dys[i] * 0.5 * (1.0 + t));
  }
  EXPECT_FALSE(hr::test::nmse_within(wrong, fd_gelu_grad(xs, dys), bound(), "wrong derivative"));
}

TEST_P(OpsGelu, SameInputsGiveBitwiseIdenticalOutputs) {
  HR_TEST_DEVICE(dev, GetParam().backend);
  const int64_t n = 4097;
  const Tensor x = input(dev, n, 700), dy = input(dev, n, 701);
  auto run = [&] {
    Tensor y = Tensor::empty(dev, {n}, dtype(), Consumer::activations);
    Tensor dx = Tensor::empty(dev, {n}, dtype(), Consumer::activations);
    hr::ops::gelu_forward(x, y);
    hr::ops::gelu_backward(x, dy, dx);
    return std::make_pair(y.to_host_bytes(), dx.to_host_bytes());
  };
  EXPECT_EQ(run(), run());
}

TEST_P(OpsGelu, InPlaceForwardEqualsOutOfPlace) {
  HR_TEST_DEVICE(dev, GetParam().backend);
  const int64_t n = 129;
  Tensor x = input(dev, n, 800);
  Tensor y = Tensor::empty(dev, {n}, dtype(), Consumer::activations);
  hr::ops::gelu_forward(x, y);
  hr::ops::gelu_forward(x, x);
  EXPECT_EQ(x.to_host_bytes(), y.to_host_bytes());
}

TEST_P(OpsGelu, MismatchedShapesThrow) {
  HR_TEST_DEVICE(dev, GetParam().backend);
  const Tensor x = input(dev, 16, 900);
  Tensor y = Tensor::empty(dev, {15}, dtype(), Consumer::activations);
  EXPECT_THROW(hr::ops::gelu_forward(x, y), hr::Error);
  EXPECT_THROW(hr::ops::gelu_backward(x, x, y), hr::Error);
}

INSTANTIATE_TEST_SUITE_P(AllBackends, OpsGelu, testing::ValuesIn(hr::test::all_backend_dtypes()),
                         hr::test::param_name);

}  // namespace
