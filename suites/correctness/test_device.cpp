// Device records and backend selection.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <utility>
#include <vector>

#include <sys/resource.h>

#include "harness/check.hpp"
#include "harness/data/synthetic.hpp"
#include "harness/kernel_calls.hpp"
#include "harness/properties/microbatch_sweep.hpp"
#include "harness/properties/sweep_support.hpp"
#include "harness/step/train_step.hpp"
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

// The CPU device keeps freed memory in the heap (harness/device.cpp): a training
// step after the first finds the pages the one before it freed, with few page
// faults, until release_cached gives them back to the kernel, after which a step
// faults its pages in again. Counts are relative to the first step's, which the heap
// grows for: a host with transparent huge pages always on faults in 2 MiB pages.
// Here the first step faulted about 8,600 pages in. Without the heap setting, each
// step after it faulted 384-3,168 pages in again; with it, none from the fourth.
TEST(Device, CpuFreedMemoryIsReusedUntilReleased) {
#if defined(__SANITIZE_ADDRESS__) || !defined(__GLIBC__)
  GTEST_SKIP() << "the heap settings are glibc's, and AddressSanitizer's allocator does not take them";
#else
  auto dev = hr::make_device("cpu");
  hr::StepConfig cfg = hr::props::microbatch_sweep_config(hr::Preset::quick, hr::BackendKind::cpu).base;
  cfg.micro_batch = cfg.batch;
  const hr::props::OneBlasThread one_blas_thread(*dev);
  hr::TrainStep step(*dev, cfg);
  const hr::Batch batch = hr::make_lm_batch(*dev, cfg.transformer, cfg.batch, cfg.seq_len, 3);
  auto faults_of_a_step = [&] {
    rusage before{}, after{};
    getrusage(RUSAGE_SELF, &before);
    step.step(batch);
    getrusage(RUSAGE_SELF, &after);
    return static_cast<size_t>(after.ru_minflt - before.ru_minflt);
  };
  const size_t first = faults_of_a_step();
  faults_of_a_step();
  faults_of_a_step();  // the heap settles over two steps
  // The fewest of three steps: now and then one step still faults a few hundred
  // pages in (256 in one of about 10 runs) where the others fault none.
  size_t reused = faults_of_a_step();
  for (int i = 0; i < 2; ++i) reused = std::min(reused, faults_of_a_step());
  dev->release_cached();
  const size_t released = faults_of_a_step();
  if (first < 1000) GTEST_SKIP() << "the first step faulted only " << first << " pages in: huge pages";
  EXPECT_LT(reused * 50, first) << "a step should find the pages the one before freed (" << reused
                                << " faults, the first step " << first << ")";
  EXPECT_GT(released * 4, first) << "after release_cached a step should fault its pages in again (" << released
                                 << " faults, the first step " << first << ")";
#endif
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

// The CUDA pool keeps what is freed, in the pieces it was freed in. Here it takes
// the card in pieces of 2 GiB and every other one is freed: no free piece is next to
// another, and the driver has less than a piece left. One request of two pieces
// must still succeed: on out-of-memory the pool gives back what it does not use and
// asks once more (as TRADE's rows need after a baseline that did not fit), and
// counts that it did. The control, the pool keeping its pieces (PoolFault), fails
// the same request. Each half starts from a pool that holds nothing, and the test
// leaves it so for the tests after it in this process.
TEST(Device, cuda_AnOutOfMemoryGivesThePoolsPiecesBack) {
  HR_TEST_DEVICE(dev, hr::BackendKind::cuda);
  constexpr size_t kPiece = size_t{2} << 30;
  const size_t held_before = dev.memory().snapshot().total_current_bytes;
  auto try_allocate = [&](size_t bytes) -> void* {
    try {
      return dev.allocate(bytes, hr::Consumer::workspace);
    } catch (const hr::OutOfMemory&) {
      return nullptr;
    }
  };
  // Fills the card, frees the odd pieces, asks for two pieces in one, frees the rest.
  auto fragmented_request = [&]() {
    dev.release_cached();
    std::vector<void*> pieces;
    const size_t cap = dev.record().memory_bytes / kPiece + 2;
    while (pieces.size() < cap) {
      void* p = try_allocate(kPiece);
      if (p == nullptr) break;
      pieces.push_back(p);
    }
    EXPECT_GE(pieces.size(), 4u) << "a card of fewer than 8 GiB free leaves nothing to fragment";
    EXPECT_LT(pieces.size(), cap) << "the card never ran out of memory";
    for (size_t i = 1; i < pieces.size(); i += 2) dev.deallocate(pieces[i], kPiece, hr::Consumer::workspace);
    dev.synchronize();
    const size_t releases = dev.pool_releases_on_oom();
    void* two = try_allocate(2 * kPiece);
    const bool released = dev.pool_releases_on_oom() > releases;
    if (two != nullptr) dev.deallocate(two, 2 * kPiece, hr::Consumer::workspace);
    for (size_t i = 0; i < pieces.size(); i += 2) dev.deallocate(pieces[i], kPiece, hr::Consumer::workspace);
    dev.release_cached();
    return std::pair{two != nullptr, released};
  };
  {
    const hr::faults::Scoped<hr::PoolFault> keep(hr::PoolFault{true});
    const auto [ok, released] = fragmented_request();
    EXPECT_FALSE(ok) << "the control: a pool that keeps its pieces must fail the request";
    EXPECT_FALSE(released);
  }
  const auto [ok, released] = fragmented_request();
  EXPECT_TRUE(ok);
  EXPECT_TRUE(released) << "the request must have needed the pool's pieces given back";
  EXPECT_EQ(dev.memory().snapshot().total_current_bytes, held_before) << "every piece is accounted back";
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

// A region's kernels are recorded per run of it: those it ran in its timed
// repetitions, neither its warm-up's nor what ran before it. An injected slowdown
// (the region once a repetition, then a wait) counts the same calls per run.
TEST(Timing, TimeRegionRecordsTheKernelsItRan) {
  auto dev = hr::make_cpu_device();
  hr::count_kernel_call("timing_test:before");
  hr::TimingOptions opt;
  opt.warmup = 3;
  opt.min_reps = opt.max_reps = 4;
  int runs = 0;
  auto region = [&] {
    if (++runs <= opt.warmup) hr::count_kernel_call("timing_test:warmup");
    hr::count_kernel_call("timing_test:a");
    hr::count_kernel_call("timing_test:a");
    hr::count_kernel_call("timing_test:b");
  };
  const hr::props::OneBlasThread one_blas_thread(*dev);
  const auto t = hr::time_region(*dev, region, opt);
  EXPECT_EQ(t.kernel_calls, (std::map<std::string, double>{{"timing_test:a", 2.0}, {"timing_test:b", 1.0}}));
  opt.warmup = 0;
  opt.injected_slowdown = 2.0;
  const auto slowed = hr::time_region(*dev, region, opt);
  EXPECT_EQ(slowed.kernel_calls, (std::map<std::string, double>{{"timing_test:a", 2.0}, {"timing_test:b", 1.0}}));
  EXPECT_TRUE(hr::time_region(*dev, [] {}, opt).kernel_calls.empty());
}

// A timed region records the kernels it asked for and did not run, each with every
// reason of its own runs (sorted, joined): not its warm-up's, not one before it.
TEST(Timing, TimeRegionRecordsTheFallbacksOfItsRuns) {
  auto dev = hr::make_cpu_device();
  hr::count_kernel_fallback("timing_test:before", "not in the region");
  hr::TimingOptions opt;
  opt.warmup = 2;
  opt.min_reps = opt.max_reps = 3;
  int runs = 0;
  auto region = [&] {
    ++runs;
    hr::count_kernel_call("timing_test:ran");
    hr::count_kernel_fallback("timing_test:asked", runs <= opt.warmup
                                                       ? std::string("in the warm-up")
                                                       : fmt::format("reason {}", runs % 2 == 1 ? "odd" : "even"));
  };
  const hr::props::OneBlasThread one_blas_thread(*dev);
  const auto t = hr::time_region(*dev, region, opt);
  EXPECT_EQ(t.kernel_fallbacks, (std::map<std::string, std::string>{{"timing_test:asked", "reason even; reason odd"}}));
  EXPECT_TRUE(hr::time_region(*dev, [] { hr::count_kernel_call("timing_test:ran"); }, opt).kernel_fallbacks.empty());
}

}  // namespace
