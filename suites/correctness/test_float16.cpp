// fp16 / bf16 storage rounding on the CPU: round to nearest even, subnormals,
// overflow to inf, NaN kept; checked exhaustively against the float64 definition.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "harness/tensor.hpp"
#include "kernels/common/float16.hpp"
#include "kernels/common/widen.hpp"
#include "suites/common/test_support.hpp"

namespace {

// Round x to the nearest representable value of a binary format with `mant`
// explicit mantissa bits and minimum normal exponent `emin`, ties to even, in
// float64: the definition the bit-twiddling must agree with.
double round_format(double x, int mant, int emin, double max_finite) {
  if (std::isnan(x) || std::isinf(x)) return x;
  const double ax = std::fabs(x);
  int e = ax == 0 ? emin : std::max(static_cast<int>(std::floor(std::log2(ax))), emin);
  if (ax != 0 && std::ldexp(1.0, e) > ax) --e;  // guard log2 rounding
  if (ax != 0 && std::ldexp(1.0, e + 1) <= ax) ++e;
  e = std::max(e, emin);
  const double ulp = std::ldexp(1.0, e - mant);
  const double q = std::nearbyint(ax / ulp);  // default rounding mode: ties to even
  double r = q * ulp;
  // Overflow: values at or beyond max + ulp/2 become inf.
  if (r > max_finite) r = std::numeric_limits<double>::infinity();
  return std::copysign(r, x);
}

// The table that widens whole arrays gives every pattern's float bit for bit, NaN
// payloads and subnormals included, at any alignment of the array.
TEST(Float16, WideningByTableMatchesTheConversionForEveryPattern) {
  std::vector<hr::half_t> all(0x10001);
  for (uint32_t b = 0; b < 0x10000u; ++b) all[b + 1].bits = static_cast<uint16_t>(b);
  std::vector<float> wide(all.size());
  hr::widen_floats(all.data() + 1, wide.data(), 0x10000);
  int differ = 0;
  for (uint32_t b = 0; b < 0x10000u; ++b)
    differ += hr::float_bits(wide[b]) != hr::float_bits(hr::half_bits_to_float(static_cast<uint16_t>(b)));
  EXPECT_EQ(differ, 0);
  EXPECT_EQ(hr::float_bits(wide[0x7e01]), 0x7fc02000u);  // a quiet NaN's payload
  EXPECT_EQ(wide[1], std::ldexp(1.0f, -24));             // the least subnormal
}

TEST(Float16, HalfRoundTripOfEveryPattern) {
  int checked = 0;
  for (uint32_t b = 0; b < 0x10000u; ++b) {
    const uint16_t h = static_cast<uint16_t>(b);
    const float f = hr::half_bits_to_float(h);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(hr::half_bits_to_float(hr::float_to_half_bits(f))));
      continue;
    }
    ASSERT_EQ(hr::float_to_half_bits(f), h) << "pattern " << b;
    ++checked;
  }
  EXPECT_EQ(checked, 0x10000 - 2 * 1023);
}

TEST(Float16, HalfRoundsToNearestEvenWithSubnormalsAndOverflow) {
  std::mt19937 rng(42);
  // Magnitudes spanning fp16's subnormals (< 2^-14), normals and overflow.
  std::uniform_real_distribution<double> log_mag(-30.0, 17.0);
  int mismatches = 0;
  for (int i = 0; i < 200000; ++i) {
    const float x = static_cast<float>((i % 2 ? -1 : 1) * std::exp2(log_mag(rng)));
    const double want = round_format(x, 10, -14, 65504.0);
    const double got = hr::half_bits_to_float(hr::float_to_half_bits(x));
    mismatches += !(got == want);
  }
  EXPECT_EQ(mismatches, 0);
  // Exact ties: 2^-25 (half the smallest subnormal) rounds to 0, 3*2^-25 to 2*2^-24.
  EXPECT_EQ(hr::float_to_half_bits(std::ldexp(1.f, -25)), 0u);
  EXPECT_EQ(hr::float_to_half_bits(std::ldexp(3.f, -25)), 2u);
  EXPECT_EQ(hr::float_to_half_bits(65519.f), 0x7bffu);  // below the tie: max finite
  EXPECT_EQ(hr::float_to_half_bits(65520.f), 0x7c00u);  // the tie rounds to inf
  EXPECT_EQ(hr::float_to_half_bits(-1e6f), 0xfc00u);
}

TEST(Float16, Bf16RoundsToNearestEven) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> log_mag(-140.0, 127.0);
  int mismatches = 0;
  for (int i = 0; i < 200000; ++i) {
    const float x = static_cast<float>((i % 2 ? -1 : 1) * std::exp2(log_mag(rng)));
    const double want = round_format(x, 7, -126, 3.3895313892515355e38);
    const double got = hr::bf16_bits_to_float(hr::float_to_bf16_bits(x));
    mismatches += !(got == want);
  }
  EXPECT_EQ(mismatches, 0);
  EXPECT_TRUE(std::isnan(hr::bf16_bits_to_float(hr::float_to_bf16_bits(std::nanf("")))));
  EXPECT_TRUE(std::isinf(hr::bf16_bits_to_float(hr::float_to_bf16_bits(3.4e38f))));
}

class TensorStorage : public testing::TestWithParam<hr::test::BackendDType> {};

TEST_P(TensorStorage, StoresRoundToTheDtype) {
  HR_TEST_DEVICE(dev, GetParam().backend);
  const hr::DType dt = GetParam().dtype;
  auto v = hr::test::random_nonzero(4097, 3, -70000.f, 70000.f);
  v[0] = 1e-7f;  // an fp16 subnormal
  v[1] = 1e-9f;  // flushes to zero in fp16, not in bf16
  hr::Tensor t = hr::Tensor::from_host(dev, v, {4097}, dt, hr::Consumer::workspace);
  const auto back = t.to_host_f32();
  for (size_t i = 0; i < v.size(); ++i) {
    float want = v[i];
    if (dt == hr::DType::f16) want = hr::round_to<hr::half_t>(v[i]);
    if (dt == hr::DType::bf16) want = hr::round_to<hr::bfloat16_t>(v[i]);
    ASSERT_EQ(back[i], want) << i;
  }
  if (dt == hr::DType::f16) {
    EXPECT_EQ(back[1], 0.f);
    EXPECT_GT(back[0], 0.f);
  }
  if (dt == hr::DType::bf16) EXPECT_GT(back[1], 0.f);
}

INSTANTIATE_TEST_SUITE_P(All, TensorStorage, testing::ValuesIn(hr::test::all_backend_dtypes()),
                         hr::test::param_name);

}  // namespace
