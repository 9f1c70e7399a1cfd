// The tracking allocator: bytes per consumer, peaks and their reset, the budget
// failure, the Nth-allocation failure, and nothing leaked after either; on every
// backend (the CUDA cases skip without a device).
#include <gtest/gtest.h>

#include <optional>

#include "harness/check.hpp"
#include "harness/tensor.hpp"
#include "suites/common/test_support.hpp"

namespace {

using hr::BackendKind;
using hr::Consumer;
using hr::DType;
using hr::Tensor;

class Memory : public testing::TestWithParam<BackendKind> {};

TEST_P(Memory, CountsBytesPerConsumer) {
  HR_TEST_DEVICE(dev, GetParam());
  const auto before = dev.memory().snapshot();
  {
    Tensor w = Tensor::empty(dev, {17, 33}, DType::f32, Consumer::weights);
    Tensor g = Tensor::empty(dev, {17, 33}, DType::bf16, Consumer::gradients);
    Tensor a = Tensor::empty(dev, {129}, DType::f16, Consumer::activations);
    const auto s = dev.memory().snapshot();
    EXPECT_EQ(s.current(Consumer::weights) - before.current(Consumer::weights), 17u * 33u * 4u);
    EXPECT_EQ(s.current(Consumer::gradients) - before.current(Consumer::gradients), 17u * 33u * 2u);
    EXPECT_EQ(s.current(Consumer::activations) - before.current(Consumer::activations), 129u * 2u);
    EXPECT_EQ(s.current(Consumer::optimizer_state), before.current(Consumer::optimizer_state));
    EXPECT_EQ(s.total_current_bytes - before.total_current_bytes, 17u * 33u * 6u + 258u);
    EXPECT_EQ(s.live_allocations - before.live_allocations, 3u);
    // Views share storage: no new bytes.
    Tensor v = w.slice(2, 5).reshape({-1});
    EXPECT_EQ(dev.memory().snapshot().total_current_bytes, s.total_current_bytes);
  }
  const auto after = dev.memory().snapshot();
  EXPECT_EQ(after.total_current_bytes, before.total_current_bytes);
  EXPECT_EQ(after.live_allocations, before.live_allocations);
}

TEST_P(Memory, PeaksTrackHighWaterAndReset) {
  HR_TEST_DEVICE(dev, GetParam());
  dev.memory().reset_peak();
  const size_t base = dev.memory().snapshot().total_current_bytes;
  {
    Tensor a = Tensor::empty(dev, {1000}, DType::f32, Consumer::activations);
    { Tensor b = Tensor::empty(dev, {3000}, DType::f32, Consumer::activations); }
    Tensor w = Tensor::empty(dev, {500}, DType::f32, Consumer::workspace);
    const auto s = dev.memory().snapshot();
    EXPECT_EQ(s.peak(Consumer::activations), 4000u * 4u);
    EXPECT_EQ(s.current(Consumer::activations), 1000u * 4u);
    EXPECT_EQ(s.peak(Consumer::workspace), 500u * 4u);
    // Total peak is the high-water mark of the sum (4000 floats), not the sum of peaks.
    EXPECT_EQ(s.total_peak_bytes, base + 4000u * 4u);
    dev.memory().reset_peak();
    const auto r = dev.memory().snapshot();
    EXPECT_EQ(r.peak(Consumer::activations), 1000u * 4u);
    EXPECT_EQ(r.total_peak_bytes, base + 1500u * 4u);
  }
}

// The most allocations alive at once (MEM-3 bounds a pool's rounding with it).
TEST_P(Memory, PeakLiveAllocationsTrackHighWaterAndReset) {
  HR_TEST_DEVICE(dev, GetParam());
  dev.memory().reset_peak();
  const uint64_t base = dev.memory().snapshot().live_allocations;
  EXPECT_EQ(dev.memory().snapshot().peak_live_allocations, base);
  {
    Tensor a = Tensor::empty(dev, {3}, DType::f32, Consumer::activations);
    {
      Tensor b = Tensor::empty(dev, {5}, DType::f16, Consumer::workspace);
      Tensor c = Tensor::empty(dev, {7}, DType::bf16, Consumer::workspace);
      Tensor view = c.slice(1, 3);  // a view: no allocation
    }
    Tensor d = Tensor::empty(dev, {9}, DType::f32, Consumer::weights);
    const auto s = dev.memory().snapshot();
    EXPECT_EQ(s.live_allocations, base + 2);
    EXPECT_EQ(s.peak_live_allocations, base + 3);
    dev.memory().reset_peak();
    EXPECT_EQ(dev.memory().snapshot().peak_live_allocations, base + 2);
  }
}

TEST_P(Memory, BudgetFailsLikeOutOfMemoryAndLeaksNothing) {
  HR_TEST_DEVICE(dev, GetParam());
  const auto before = dev.memory().snapshot();
  dev.memory().set_budget(before.total_current_bytes + 10000);
  {
    Tensor a = Tensor::empty(dev, {2000}, DType::f32, Consumer::weights);  // 8000 B: fits
    EXPECT_THROW(Tensor::empty(dev, {1000}, DType::f32, Consumer::activations), hr::OutOfMemory);
    const auto s = dev.memory().snapshot();
    EXPECT_EQ(s.total_current_bytes, before.total_current_bytes + 8000u);
    EXPECT_EQ(s.current(Consumer::activations), before.current(Consumer::activations));
    // Just under the budget still fits.
    Tensor b = Tensor::empty(dev, {500}, DType::f32, Consumer::activations);
    EXPECT_EQ(dev.memory().snapshot().total_current_bytes, before.total_current_bytes + 10000u);
  }
  dev.memory().set_budget(std::nullopt);
  const auto after = dev.memory().snapshot();
  EXPECT_EQ(after.total_current_bytes, before.total_current_bytes);
  EXPECT_EQ(after.live_allocations, before.live_allocations);
  Tensor big = Tensor::empty(dev, {1 << 20}, DType::f32, Consumer::workspace);  // unlimited again
  EXPECT_EQ(big.numel(), 1 << 20);
}

TEST_P(Memory, NthAllocationFailsOnceAndLeaksNothing) {
  HR_TEST_DEVICE(dev, GetParam());
  const auto before = dev.memory().snapshot();
  dev.memory().fail_nth_allocation(3);
  std::vector<Tensor> kept;
  int failed_at = 0;
  for (int i = 1; i <= 5; ++i) {
    try {
      kept.push_back(Tensor::empty(dev, {64 * i}, DType::f16, Consumer::optimizer_state));
    } catch (const hr::OutOfMemory& e) {
      failed_at = i;
      EXPECT_NE(std::string(e.what()).find("injected"), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(failed_at, 3);
  EXPECT_EQ(kept.size(), 4u);
  size_t expect = 0;
  for (int i : {1, 2, 4, 5}) expect += 64u * static_cast<size_t>(i) * 2u;
  EXPECT_EQ(dev.memory().snapshot().current(Consumer::optimizer_state) - before.current(Consumer::optimizer_state),
            expect);
  kept.clear();
  const auto after = dev.memory().snapshot();
  EXPECT_EQ(after.total_current_bytes, before.total_current_bytes);
  EXPECT_EQ(after.live_allocations, before.live_allocations);
}

TEST(MemoryPool, cuda_HighWaterMatchesTracker) {
  HR_TEST_DEVICE(dev, BackendKind::cuda);
  dev.synchronize();
  dev.reset_pool_high_water();
  dev.memory().reset_peak();
  {
    Tensor a = Tensor::empty(dev, {64 << 20}, DType::f32, Consumer::activations);
    Tensor b = Tensor::empty(dev, {32 << 20}, DType::f16, Consumer::weights);
    dev.synchronize();
  }
  const auto pool = dev.pool_used_high_bytes();
  ASSERT_TRUE(pool.has_value());
  const double tracked = static_cast<double>(dev.memory().snapshot().total_peak_bytes);
  EXPECT_NEAR(static_cast<double>(*pool) / tracked, 1.0, 0.01);  // MEM-3: within 1%
}

INSTANTIATE_TEST_SUITE_P(Backends, Memory, testing::Values(BackendKind::cpu, BackendKind::cuda),
                         hr::test::backend_param_name);

}  // namespace
