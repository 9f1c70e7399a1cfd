// Device records and backend selection.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "harness/check.hpp"
#include "harness/properties/sweep_support.hpp"
#include "harness/timing.hpp"
#include "suites/common/test_support.hpp"

namespace {

TEST(Device, CpuRecordNamesModelAndCores) {
  auto dev = hr::make_device("cpu");
  EXPECT_EQ(dev->kind(), hr::BackendKind::cpu);
  EXPECT_FALSE(dev->record().name.empty());
  EXPECT_GE(dev->record().cores, 1);
  nlohmann::json j = dev->record();
  EXPECT_EQ(j.at("backend"), "cpu");
}

TEST(Device, UnknownBackendIsRefused) {
  EXPECT_THROW(hr::make_device("tpu"), hr::InvalidArgument);
}

TEST(Device, AutoPicksTheGpuOnlyWhenADeviceAnswers) {
  std::string why;
  const bool have = hr::cuda_device_available(&why);
  auto dev = hr::make_device("auto");
  EXPECT_EQ(dev->is_cuda(), have);
  if (!have) {
    EXPECT_FALSE(why.empty());
  }
}

TEST(Device, cuda_RecordHasComputeCapabilityAndVersions) {
  HR_TEST_DEVICE(dev, hr::BackendKind::cuda);
  const auto& r = dev.record();
  EXPECT_GE(r.cc_major, 7);
  EXPECT_GT(r.sm_count, 0);
  EXPECT_GT(r.memory_bytes, 0u);
  EXPECT_GT(r.driver_version, 0);
  EXPECT_GT(r.runtime_version, 0);
  EXPECT_GT(r.cublas_version, 0);
}

TEST(Timing, SummaryStatistics) {
  const auto t = hr::summarize_times({3.0, 1.0, 2.0, 4.0, 100.0});
  EXPECT_EQ(t.reps, 5);
  EXPECT_DOUBLE_EQ(t.median_s, 3.0);
  EXPECT_DOUBLE_EQ(t.min_s, 1.0);
  EXPECT_DOUBLE_EQ(t.max_s, 100.0);
  EXPECT_DOUBLE_EQ(t.mad_s, 1.0);
  EXPECT_TRUE(t.noisy);
  const auto q = hr::summarize_times({1.0, 1.01, 0.99, 1.0});
  EXPECT_FALSE(q.noisy);
}

TEST(Timing, TimeRegionRunsWarmupAndRepetitions) {
  auto dev = hr::make_cpu_device();
  int calls = 0;
  hr::TimingOptions opt;
  opt.warmup = 3;
  opt.min_reps = 7;
  opt.max_reps = 7;
  const hr::props::OneBlasThread one_blas_thread(*dev);
  const auto t = hr::time_region(*dev, [&] { ++calls; }, opt);
  EXPECT_EQ(calls, 10);
  EXPECT_EQ(t.reps, 7);
}

}  // namespace
