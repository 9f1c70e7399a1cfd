// OPS-3: the shared Philox4x32-10 against cuRAND's host generator (which needs no
// GPU), over several seeds and offsets; and, on a GPU, device draws against host.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "harness/models/params.hpp"
#include "kernels/common/philox.hpp"
#include "suites/common/test_support.hpp"

#if HEADROOM_HAVE_CUDA
#include <curand.h>
#endif

namespace {

TEST(Philox, KnownAnswerFromRandom123) {
  // Random123's published known-answer vector for philox4x32_10 (counter and
  // key all ones-bits pattern 0x243f6a88...): checks the round function itself.
  const hr::Philox4 ctr{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u};
  const hr::Philox4 r = hr::philox4x32_10(ctr, 0xa4093822u, 0x299f31d0u);
  EXPECT_EQ(r.x, 0xd16cfe09u);
  EXPECT_EQ(r.y, 0x94fdccebu);
  EXPECT_EQ(r.z, 0x5001e420u);
  EXPECT_EQ(r.w, 0x24126ea1u);
}

TEST(Philox, DrawsAreDistinctAcrossSeedsAndOffsets) {
  // Negative control for the comparison below: a different seed or offset must
  // change the stream, or matching cuRAND would prove nothing.
  int same_seed = 0, same_offset = 0;
  for (uint64_t i = 0; i < 4096; ++i) {
    same_seed += hr::philox_draw(1, i) == hr::philox_draw(2, i);
    same_offset += hr::philox_draw(1, i) == hr::philox_draw(1, i + 1);
  }
  EXPECT_LE(same_seed, 2);
  EXPECT_LE(same_offset, 2);
}

TEST(Philox, UniformIsInOpenZeroClosedOne) {
  EXPECT_GT(hr::uniform_from_u32(0u), 0.f);
  EXPECT_LE(hr::uniform_from_u32(0xffffffffu), 1.f);
}

#if HEADROOM_HAVE_CUDA
class CurandHost {
 public:
  CurandHost() { ok_ = curandCreateGeneratorHost(&g_, CURAND_RNG_PSEUDO_PHILOX4_32_10) == CURAND_STATUS_SUCCESS; }
  ~CurandHost() {
    if (ok_) curandDestroyGenerator(g_);
  }
  bool ok() const { return ok_; }
  std::vector<uint32_t> draws(uint64_t seed, uint64_t offset, size_t n) {
    std::vector<uint32_t> v(n);
    EXPECT_EQ(curandSetPseudoRandomGeneratorSeed(g_, seed), CURAND_STATUS_SUCCESS);
    EXPECT_EQ(curandSetGeneratorOffset(g_, offset), CURAND_STATUS_SUCCESS);
    EXPECT_EQ(curandGenerate(g_, v.data(), n), CURAND_STATUS_SUCCESS);
    return v;
  }
  std::vector<float> uniforms(uint64_t seed, uint64_t offset, size_t n) {
    std::vector<float> v(n);
    EXPECT_EQ(curandSetPseudoRandomGeneratorSeed(g_, seed), CURAND_STATUS_SUCCESS);
    EXPECT_EQ(curandSetGeneratorOffset(g_, offset), CURAND_STATUS_SUCCESS);
    EXPECT_EQ(curandGenerateUniform(g_, v.data(), n), CURAND_STATUS_SUCCESS);
    return v;
  }

 private:
  curandGenerator_t g_{};
  bool ok_ = false;
};
#endif

TEST(Philox, MatchesCurandHostGenerator) {
#if !HEADROOM_HAVE_CUDA
  GTEST_SKIP() << "built without CUDA: cuRAND's host generator is not available";
#else
  CurandHost gen;
  ASSERT_TRUE(gen.ok()) << "curandCreateGeneratorHost failed";
  // 300k draws cross the 65536-thread boundary of cuRAND's host ordering (block 65536).
  const size_t n = 300000;
  size_t compared = 0;
  for (uint64_t seed : {0ull, 1ull, 1234ull, 0x9e3779b97f4a7c15ull, 0xffffffffffffffffull}) {
    for (uint64_t offset : {0ull, 1ull, 3ull, 4ull, 1001ull, 262143ull, 262144ull, (1ull << 33) + 7}) {
      const auto ref = gen.draws(seed, offset, n);
      size_t mismatches = 0;
      for (size_t i = 0; i < n; ++i) mismatches += ref[i] != hr::philox_draw(seed, offset + i);
      EXPECT_EQ(mismatches, 0u) << "seed " << seed << " offset " << offset;
      compared += n;
    }
  }
  EXPECT_EQ(compared, 5u * 8u * n);
#endif
}

TEST(Philox, UniformMatchesCurandHostGenerator) {
#if !HEADROOM_HAVE_CUDA
  GTEST_SKIP() << "built without CUDA: cuRAND's host generator is not available";
#else
  CurandHost gen;
  ASSERT_TRUE(gen.ok());
  for (uint64_t seed : {7ull, 424242ull}) {
    for (uint64_t offset : {0ull, 4ull, 100000ull}) {
      const auto ref = gen.uniforms(seed, offset, 20000);
      size_t mismatches = 0;
      for (size_t i = 0; i < ref.size(); ++i)
        mismatches += ref[i] != hr::uniform_from_u32(hr::philox_draw(seed, offset + i));
      EXPECT_EQ(mismatches, 0u) << "seed " << seed << " offset " << offset;
    }
  }
#endif
}

// Parameter initialisation draws four values per Philox block and splits large
// tensors across threads: each value must still be the one its own draw index
// gives, at chunk edges and for an odd count (the last Box-Muller pair half used).
TEST(Philox, ParameterInitialisationEqualsOneDrawPerValue) {
  const uint64_t seed = 99, offset = uint64_t{3} << 40;
  const int64_t n = (int64_t{3} << 20) + 3;
  const std::vector<float> normal = hr::philox_normal(seed, offset, n, 0.5f, 0.02f);
  const std::vector<float> uniform = hr::philox_uniform(seed, offset, n, -0.1f, 0.1f);
  ASSERT_EQ(normal.size(), static_cast<size_t>(n));
  ASSERT_EQ(uniform.size(), static_cast<size_t>(n));
  int64_t normal_mismatches = 0, uniform_mismatches = 0;
  for (int64_t i = 0; i < n; i += 2) {
    const double u1 = hr::uniform_from_u32(hr::philox_draw(seed, offset + static_cast<uint64_t>(i)));
    const double u2 = hr::uniform_from_u32(hr::philox_draw(seed, offset + static_cast<uint64_t>(i) + 1));
    const double r = std::sqrt(-2.0 * std::log(u1)), a = 6.283185307179586 * u2;
    normal_mismatches += normal[static_cast<size_t>(i)] != static_cast<float>(0.5f + 0.02f * r * std::cos(a));
    if (i + 1 < n)
      normal_mismatches += normal[static_cast<size_t>(i) + 1] != static_cast<float>(0.5f + 0.02f * r * std::sin(a));
  }
  for (int64_t i = 0; i < n; ++i) {
    const double u = 1.0 - hr::uniform_from_u32(hr::philox_draw(seed, offset + static_cast<uint64_t>(i)));
    uniform_mismatches += uniform[static_cast<size_t>(i)] != static_cast<float>(-0.1f + 0.2f * u);
  }
  EXPECT_EQ(normal_mismatches, 0);
  EXPECT_EQ(uniform_mismatches, 0);
  // Negative control: the next seed's values differ almost everywhere.
  const std::vector<float> other = hr::philox_normal(seed + 1, offset, 1024, 0.5f, 0.02f);
  int64_t same = 0;
  for (size_t i = 0; i < other.size(); ++i) same += other[i] == normal[i];
  EXPECT_LT(same, 8);
}

}  // namespace
