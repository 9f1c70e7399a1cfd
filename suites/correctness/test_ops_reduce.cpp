// OPS-1 and DET-1 for the reductions (sum, squared_norm) on every backend x dtype
// against float64, and the loss scaler's checks (MP-3's premise): an inf or NaN at
// the first, middle or last index is found, a clean tensor is not flagged, and
// unscaling multiplies every element once.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "harness/check.hpp"
#include "kernels/elementwise/elementwise_ref.hpp"
#include "kernels/reduce/reduce.hpp"
#include "kernels/reduce/reduce_ref.hpp"
#include "suites/common/op_check.hpp"
#include "suites/common/test_support.hpp"
#include "harness/tolerances.hpp"

namespace {

using hr::Consumer;
using hr::DType;
using hr::Tensor;
using hr::test::stored_values;

class OpsReduce : public testing::TestWithParam<hr::test::BackendDType> {
 protected:
  DType dtype() const { return GetParam().dtype; }
  Tensor input(hr::Device& dev, int64_t n, uint64_t seed) const {
    return Tensor::from_host(dev, hr::test::random_nonzero(static_cast<size_t>(n), seed), {n}, dtype(),
                             Consumer::gradients);
  }
  // The sums come back as double whatever the storage dtype: the fp32 sum bound.
  void expect_close(double got, double ref, const std::string& what) {
    // Compared in double: a cast to float would add its own rounding.
    const double e = ref == 0 ? (got == 0 ? 0 : INFINITY) : (got - ref) * (got - ref) / (ref * ref);
    EXPECT_LE(e, hr::tol::kSumNmse(DType::f32)) << what << ": got " << got << " want " << ref;
    EXPECT_FALSE(std::isnan(got)) << what;
    worst_ = std::max(worst_, e);
  }
  void TearDown() override { RecordProperty("max_nmse", fmt::format("{:.3e}", worst_)); }
  double worst_ = 0;
};

TEST_P(OpsReduce, SumMatchesFloat64Reference) {
  HR_TEST_DEVICE(dev, GetParam().backend);
  for (int64_t n : hr::test::edge_sizes()) {
    const Tensor x = input(dev, n, 2000 + n);
    expect_close(hr::ops::sum(x), hr::ref::sum(stored_values(x)), "sum n=" + std::to_string(n));
  }
}

TEST_P(OpsReduce, SquaredNormMatchesFloat64Reference) {
  HR_TEST_DEVICE(dev, GetParam().backend);
  for (int64_t n : hr::test::edge_sizes()) {
    const Tensor x = input(dev, n, 2100 + n);
    expect_close(hr::ops::squared_norm(x), hr::ref::squared_norm(stored_values(x)),
                 "squared_norm n=" + std::to_string(n));
  }
}

TEST_P(OpsReduce, SumsOfAViewCoverOnlyTheView) {
  // An unaligned view (slice) takes the scalar path and must not read past its end.
  HR_TEST_DEVICE(dev, GetParam().backend);
  const Tensor x = input(dev, 4099, 2200);
  const Tensor v = x.slice(1, 4098);
  expect_close(hr::ops::sum(v), hr::ref::sum(stored_values(v)), "sum of a view");
}

TEST_P(OpsReduce, SameInputsGiveBitwiseIdenticalSums) {
  HR_TEST_DEVICE(dev, GetParam().backend);
  const Tensor x = input(dev, (int64_t{1} << 20) + 3, 2300);
  const double a = hr::ops::sum(x), b = hr::ops::sum(x);
  const double c = hr::ops::squared_norm(x), d = hr::ops::squared_norm(x);
  EXPECT_EQ(std::memcmp(&a, &b, sizeof a), 0);
  EXPECT_EQ(std::memcmp(&c, &d, sizeof c), 0);
}

TEST_P(OpsReduce, NonFiniteIsFoundAtFirstMiddleAndLastIndex) {
  HR_TEST_DEVICE(dev, GetParam().backend);
  for (int64_t n : {int64_t{1}, int64_t{17}, int64_t{4097}, int64_t{1} << 20}) {
    const std::vector<float> clean = hr::test::random_nonzero(static_cast<size_t>(n), 2400 + n);
    for (int64_t at : {int64_t{0}, n / 2, n - 1}) {
      for (float bad : {INFINITY, -INFINITY, std::nanf("")}) {
        std::vector<float> v = clean;
        v[static_cast<size_t>(at)] = bad;
        Tensor g = Tensor::from_host(dev, v, {n}, dtype(), Consumer::gradients);
        const std::string what = fmt::format("n={} at={} value={}", n, at, bad);
        EXPECT_TRUE(hr::ops::any_nonfinite(g)) << what;
        EXPECT_TRUE(hr::ops::unscale_and_check(g, 0.5f)) << what;
      }
    }
  }
}

TEST_P(OpsReduce, CleanTensorIsNotFlaggedAndIsUnscaledOnce) {
  // Negative control for the test above, and unscaling against the reference.
  HR_TEST_DEVICE(dev, GetParam().backend);
  for (int64_t n : hr::test::edge_sizes()) {
    // Values like scaled gradients: large, as a loss scale of 2^16 makes them.
    const std::vector<float> v = hr::test::random_nonzero(static_cast<size_t>(n), 2500 + n, -1000.f, 1000.f);
    hr::test::Guarded g(dev, {n}, dtype(), 64, Consumer::gradients);
    g.set(v);
    const std::vector<double> before = stored_values(g.tensor());
    EXPECT_FALSE(hr::ops::any_nonfinite(g.tensor())) << "n=" << n;
    EXPECT_FALSE(hr::ops::unscale_and_check(g.tensor(), 1.f / 65536.f)) << "n=" << n;
    EXPECT_TRUE(hr::test::nmse_within(g.values(), hr::ref::scale(before, 1.0 / 65536.0),
                                      hr::tol::kElementwiseNmse(dtype()), "unscale n=" + std::to_string(n)));
    EXPECT_TRUE(g.guards_intact());
  }
}

INSTANTIATE_TEST_SUITE_P(AllBackends, OpsReduce, testing::ValuesIn(hr::test::all_backend_dtypes()),
                         hr::test::param_name);

}  // namespace
