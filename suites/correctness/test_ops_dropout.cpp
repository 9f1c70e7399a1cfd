// OPS-1, OPS-2 and DET-1 for Philox inverted dropout on every backend x dtype, and
// the properties checkpointing relies on (CK-1): the mask replays bit for bit
// from (seed, offset), a different offset or seed gives a different mask, the
// keep fraction is 1 - p within a binomial bound, p = 0 is the identity, and the
// CUDA mask equals the CPU mask bit for bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "harness/check.hpp"
#include "kernels/common/philox.hpp"
#include "kernels/dropout/dropout.hpp"
#include "kernels/dropout/dropout_ref.hpp"
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

constexpr float kP = 0.1f;
constexpr uint64_t kSeed = 0x5eed1234abcdull;

class OpsDropout : public testing::TestWithParam<hr::test::BackendDType> {
 protected:
  DType dtype() const { return GetParam().dtype; }
  double bound() const { return hr::tol::kElementwiseNmse(dtype()); }
  Tensor input(hr::Device& dev, int64_t n, uint64_t seed) const {
    return Tensor::from_host(dev, hr::test::random_nonzero(static_cast<size_t>(n), seed), {n}, dtype(),
                             Consumer::activations);
  }
  std::vector<uint8_t> mask(hr::Device& dev, int64_t n, float p, uint64_t seed, uint64_t offset) const {
    Tensor m = Tensor::empty(dev, {n}, DType::u8, Consumer::workspace);
    hr::ops::dropout_mask(n, p, seed, offset, m);
    return m.to_host_bytes();
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

// Offsets: block-aligned (the packed path), unaligned (draws start mid-block), and
// past 2^32 draws (the counter's high word).
const uint64_t kOffsets[] = {0, 6, (uint64_t{1} << 33) + 4};

TEST_P(OpsDropout, ForwardMatchesFloat64Reference) {
  HR_TEST_DEVICE(dev, GetParam().backend);
  for (uint64_t offset : kOffsets) {
    for (int64_t n : hr::test::edge_sizes()) {
      const Tensor x = input(dev, n, 1000 + n);
      Guarded y(dev, {n}, dtype());
      hr::ops::dropout_forward(x, kP, kSeed, offset, y.tensor());
      expect_close(y, hr::ref::dropout_forward(stored_values(x), kP, kSeed, offset),
                   fmt::format("dropout_forward n={} offset={}", n, offset));
    }
  }
}

TEST_P(OpsDropout, BackwardMatchesFiniteDifferences) {
  // OPS-2 (trivially linear): d/dx_i sum_j dy_j dropout(x)_j = dy_i mask_i / (1 - p).
  HR_TEST_DEVICE(dev, GetParam().backend);
  for (int64_t n : {int64_t{1}, int64_t{17}, int64_t{129}}) {
    const Tensor x = input(dev, n, 1100 + n), dy = input(dev, n, 1200 + n);
    Guarded dx(dev, {n}, dtype());
    hr::ops::dropout_backward(dy, kP, kSeed, 8, dx.tensor());
    const std::vector<double> dys = stored_values(dy);
    const std::vector<double> fd = hr::test::finite_diff_grad(
        [&](const std::vector<double>& xs) { return hr::test::dot(dys, hr::ref::dropout_forward(xs, kP, kSeed, 8)); },
        stored_values(x));
    expect_close(dx, fd, "dropout_backward vs FD n=" + std::to_string(n));
  }
}

TEST_P(OpsDropout, MaskIsThePhiloxThresholdComparison) {
  HR_TEST_DEVICE(dev, GetParam().backend);
  const int64_t n = 4097;
  for (uint64_t offset : kOffsets) {
    const std::vector<uint8_t> got = mask(dev, n, kP, kSeed, offset);
    EXPECT_EQ(got, hr::ref::dropout_mask(n, kP, kSeed, offset)) << "offset " << offset;
  }
  // Forward and backward zero exactly the masked elements.
  const Tensor x = input(dev, n, 1300);
  Tensor y = Tensor::empty(dev, {n}, dtype(), Consumer::activations);
  Tensor dx = Tensor::empty(dev, {n}, dtype(), Consumer::activations);
  hr::ops::dropout_forward(x, kP, kSeed, 12, y);
  hr::ops::dropout_backward(x, kP, kSeed, 12, dx);
  const std::vector<uint8_t> m = mask(dev, n, kP, kSeed, 12);
  const std::vector<float> yv = y.to_host_f32(), dxv = dx.to_host_f32();
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(yv[i] != 0.f, m[i] == 1) << i;
    ASSERT_EQ(dxv[i] != 0.f, m[i] == 1) << i;
  }
}

TEST_P(OpsDropout, KeepFractionIsWithinBinomialBound) {
  HR_TEST_DEVICE(dev, GetParam().backend);
  const int64_t n = int64_t{1} << 20;
  for (float p : {0.1f, 0.5f, 0.9f}) {
    const std::vector<uint8_t> m = mask(dev, n, p, kSeed + 1, 0);
    const double kept = std::accumulate(m.begin(), m.end(), 0.0) / static_cast<double>(n);
    const double sigma = std::sqrt(p * (1.0 - p) / static_cast<double>(n));
    EXPECT_NEAR(kept, 1.0 - p, hr::tol::kBinomialSigmas * sigma) << "p=" << p;
    RecordProperty(fmt::format("keep_fraction_p{}", p), fmt::format("{:.6f}", kept));
  }
}

TEST_P(OpsDropout, ReplayFromSeedAndOffsetIsBitIdentical) {
  // CK-1's premise: recomputation with the saved (seed, offset) gives the same mask
  // and the same output bytes.
  HR_TEST_DEVICE(dev, GetParam().backend);
  const int64_t n = 4097;
  const uint64_t offset = hr::philox_advance(12345);
  const Tensor x = input(dev, n, 1400);
  auto run = [&] {
    Tensor y = Tensor::empty(dev, {n}, dtype(), Consumer::activations);
    hr::ops::dropout_forward(x, kP, kSeed, offset, y);
    return y.to_host_bytes();
  };
  EXPECT_EQ(run(), run());
  EXPECT_EQ(mask(dev, n, kP, kSeed, offset), mask(dev, n, kP, kSeed, offset));
}

TEST_P(OpsDropout, NextOffsetOrOtherSeedGivesAnotherMask) {
  // CK-2's premise: a fresh RNG state drops different elements. Two independent
  // masks agree where both keep or both drop: (1-p)^2 + p^2 = 0.5 at p = 0.5.
  HR_TEST_DEVICE(dev, GetParam().backend);
  const int64_t n = 4097;
  const std::vector<uint8_t> m0 = mask(dev, n, 0.5f, kSeed, 0);
  for (const auto& other : {mask(dev, n, 0.5f, kSeed, hr::philox_advance(n)), mask(dev, n, 0.5f, kSeed + 1, 0)}) {
    size_t same = 0;
    for (int64_t i = 0; i < n; ++i) same += m0[i] == other[i];
    const double frac = static_cast<double>(same) / static_cast<double>(n);
    EXPECT_NEAR(frac, 0.5, hr::tol::kBinomialSigmas * std::sqrt(0.25 / static_cast<double>(n)));
  }
}

TEST_P(OpsDropout, ZeroProbabilityIsTheIdentity) {
  HR_TEST_DEVICE(dev, GetParam().backend);
  for (int64_t n : hr::test::edge_sizes()) {
    const Tensor x = input(dev, n, 1500 + n);
    Guarded y(dev, {n}, dtype());
    hr::ops::dropout_forward(x, 0.f, kSeed, 0, y.tensor());
    EXPECT_EQ(y.tensor().to_host_bytes(), x.to_host_bytes()) << "n=" << n;
    EXPECT_TRUE(y.guards_intact());
  }
}

TEST_P(OpsDropout, ProbabilityOutsideZeroOneIsRefused) {
  HR_TEST_DEVICE(dev, GetParam().backend);
  const Tensor x = input(dev, 16, 1600);
  Tensor y = Tensor::empty(dev, {16}, dtype(), Consumer::activations);
  EXPECT_THROW(hr::ops::dropout_forward(x, 1.f, kSeed, 0, y), hr::InvalidArgument);
  EXPECT_THROW(hr::ops::dropout_forward(x, -0.1f, kSeed, 0, y), hr::InvalidArgument);
  EXPECT_THROW(hr::ops::dropout_forward(x, std::nanf(""), kSeed, 0, y), hr::InvalidArgument);
}

INSTANTIATE_TEST_SUITE_P(AllBackends, OpsDropout, testing::ValuesIn(hr::test::all_backend_dtypes()),
                         hr::test::param_name);

TEST(DropoutThreshold, IsRoundedPTimesTwoToThe32) {
  EXPECT_EQ(hr::ops::dropout_threshold(0.f), 0u);
  EXPECT_EQ(hr::ops::dropout_threshold(0.5f), 0x80000000u);
  EXPECT_EQ(hr::ops::dropout_threshold(0.25f), 0x40000000u);
  EXPECT_EQ(hr::ops::dropout_threshold(std::nextafter(1.f, 0.f)), 0xffffff00u);
}

TEST(DropoutCuda, cuda_OutputAndMaskEqualCpuBitForBit) {
  // The backends agree byte for byte, every dtype, aligned and unaligned offsets.
  HR_TEST_DEVICE(gpu, hr::BackendKind::cuda);
  HR_TEST_DEVICE(cpu, hr::BackendKind::cpu);
  const int64_t n = 100003;
  const std::vector<float> v = hr::test::random_nonzero(static_cast<size_t>(n), 1700);
  for (DType t : hr::kFloatDTypes) {
    for (uint64_t offset : kOffsets) {
      const Tensor xg = Tensor::from_host(gpu, v, {n}, t, Consumer::activations);
      const Tensor xc = Tensor::from_host(cpu, v, {n}, t, Consumer::activations);
      Tensor yg = Tensor::empty(gpu, {n}, t, Consumer::activations);
      Tensor yc = Tensor::empty(cpu, {n}, t, Consumer::activations);
      hr::ops::dropout_forward(xg, 0.3f, kSeed, offset, yg);
      hr::ops::dropout_forward(xc, 0.3f, kSeed, offset, yc);
      EXPECT_EQ(yg.to_host_bytes(), yc.to_host_bytes()) << hr::dtype_name(t) << " offset " << offset;
      Tensor mg = Tensor::empty(gpu, {n}, DType::u8, Consumer::workspace);
      Tensor mc = Tensor::empty(cpu, {n}, DType::u8, Consumer::workspace);
      hr::ops::dropout_mask(n, 0.3f, kSeed, offset, mg);
      hr::ops::dropout_mask(n, 0.3f, kSeed, offset, mc);
      EXPECT_EQ(mg.to_host_bytes(), mc.to_host_bytes()) << "offset " << offset;
    }
  }
}

}  // namespace
