// How every sweep point is measured (harness/properties/sweep_support.hpp): the
// peak reset before the region, one BLAS thread inside it on the CPU and the
// previous count after it, the injected slowdown applied and recorded, the
// settings recorded, and out of memory turned into the point's status. Structure
// and bytes only: no timing is asserted.
#include <cblas.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "harness/check.hpp"
#include "harness/properties/sweep_support.hpp"
#include "harness/tensor.hpp"
#include "suites/common/test_support.hpp"

namespace {

using hr::test::ScopedEnv;

hr::TimingOptions two_reps() {
  hr::TimingOptions t;
  t.warmup = 0;
  t.min_reps = 2;
  t.max_reps = 2;
  t.min_total_s = 0;
  return t;
}

constexpr int64_t kElements = 1 << 16;  // 256 KiB of fp32

TEST(SweepSupport, TimePointRunsItsRegionOnOneBlasThreadAndRestoresTheCount) {
  HR_TEST_DEVICE(dev, hr::BackendKind::cpu);
  const int saved = openblas_get_num_threads();
  openblas_set_num_threads(2);
  hr::SweepPoint p = hr::props::sweep_point("TEST-SW", dev, hr::DType::f32, "none", {{"x", 1}});
  int inside = -1, runs = 0;
  hr::props::time_point(dev, p, two_reps(), [&] {
    inside = openblas_get_num_threads();
    ++runs;
  });
  const int after = openblas_get_num_threads();
  openblas_set_num_threads(saved);
  EXPECT_EQ(inside, 1);
  EXPECT_EQ(after, 2);
  EXPECT_EQ(p.metrics["blas_threads"], 1);
  ASSERT_TRUE(p.time.has_value());
  EXPECT_EQ(p.time->reps, 2);
  EXPECT_EQ(p.metrics["noisy"], p.time->noisy);
  // On the CPU the machine's speed is tracked beside every repetition.
  EXPECT_EQ(p.time->ref_cpu_samples_s.size(), 2u);
  EXPECT_FALSE(p.metrics.contains("injected_slowdown"));
  EXPECT_EQ(p.backend, "cpu");
  EXPECT_EQ(p.dtype, "fp32");
  EXPECT_EQ(p.status, "ok");
}

// A CPU repetition's CPU time is its own thread's: OpenBLAS's pool workers, woken by
// a product on two threads just before, spin for a while on the other core, and the
// process's clock counted them (a single-threaded product then read about twice its
// wall time). One thread's CPU time can never exceed the wall time it ran in. A
// region timed with BLAS on more than one thread is refused.
TEST(SweepSupport, ARepetitionsCpuTimeIsItsThreadsAloneAndNeverExceedsItsWallTime) {
  HR_TEST_DEVICE(dev, hr::BackendKind::cpu);
  const int saved = openblas_get_num_threads();
  openblas_set_num_threads(2);
  if (openblas_get_num_threads() < 2) {
    openblas_set_num_threads(saved);
    GTEST_SKIP() << "OpenBLAS runs one thread here: no pool to wake";
  }
  constexpr int n = 384;
  std::vector<float> a(n * n), b(n * n), c(n * n);
  for (size_t i = 0; i < a.size(); ++i) {
    a[i] = static_cast<float>((i * 37) % 101) / 101.0f - 0.5f;
    b[i] = static_cast<float>((i * 53) % 97) / 97.0f - 0.5f;
  }
  auto product = [&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
  };
  hr::TimingOptions t = two_reps();
  EXPECT_THROW(hr::time_region(dev, product, t), hr::InvalidArgument);
  product();  // the pool is awake
  hr::SweepPoint p = hr::props::sweep_point("TEST-SW", dev, hr::DType::f32, "none", {{"x", 1}});
  t.min_reps = t.max_reps = 4;
  hr::props::time_point(dev, p, t, product);
  openblas_set_num_threads(saved);
  ASSERT_TRUE(p.time.has_value());
  ASSERT_EQ(p.time->cpu_samples_s.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_GT(p.time->cpu_samples_s[i], 0.0);
    // The clocks' granularity (both read in microseconds or better) as the slack.
    EXPECT_LE(p.time->cpu_samples_s[i], p.time->samples_s[i] + 1e-4) << "repetition " << i;
  }
}

TEST(SweepSupport, TimePointAppliesAndRecordsTheInjectedSlowdownOfItsPointOnly) {
  HR_TEST_DEVICE(dev, hr::BackendKind::cpu);
  const ScopedEnv env(hr::kInjectSlowdownEnv, "TEST-SW:x=2:3");
  for (int x : {1, 2}) {
    hr::SweepPoint p = hr::props::sweep_point("TEST-SW", dev, hr::DType::f32, "none", {{"x", x}});
    int runs = 0;
    // Each run sleeps 1 ms: a repetition slowed 3x takes at least 3 ms (1% for the
    // clock's granularity), the region running once and then waiting twice its time.
    hr::props::time_point(dev, p, two_reps(), [&] {
      ++runs;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    });
    EXPECT_EQ(runs, 2);
    ASSERT_TRUE(p.time.has_value());
    if (x == 2) {
      EXPECT_EQ(p.metrics["injected_slowdown"], 3.0);
      for (double s : p.time->samples_s) EXPECT_GE(s, 0.99 * 3e-3);
    } else {
      EXPECT_FALSE(p.metrics.contains("injected_slowdown"));
    }
  }
}

// The peaks are the region's: what was allocated and freed before it does not
// count, what the region allocates does, under its consumer.
TEST(SweepSupport, PeaksAreTheRegionsAlone) {
  HR_TEST_DEVICE(dev, hr::BackendKind::cpu);
  { hr::Tensor before = hr::Tensor::zeros(dev, {4 * kElements}, hr::DType::f32, hr::Consumer::activations); }
  hr::SweepPoint timed = hr::props::sweep_point("TEST-SW", dev, hr::DType::f32, "none", {});
  hr::props::time_point(dev, timed, two_reps(), [&] {
    hr::Tensor t = hr::Tensor::zeros(dev, {kElements}, hr::DType::f32, hr::Consumer::activations);
  });
  EXPECT_EQ(timed.memory.peak(hr::Consumer::activations), static_cast<size_t>(kElements) * 4);

  hr::SweepPoint bytes = hr::props::sweep_point("TEST-SW", dev, hr::DType::f32, "none", {});
  const hr::Tensor held = hr::Tensor::zeros(dev, {kElements}, hr::DType::f32, hr::Consumer::weights);
  hr::props::peak_point(dev, bytes, [&] {
    hr::Tensor a = hr::Tensor::zeros(dev, {2 * kElements}, hr::DType::f32, hr::Consumer::activations);
    hr::Tensor w = hr::Tensor::zeros(dev, {kElements}, hr::DType::f32, hr::Consumer::workspace);
  });
  EXPECT_EQ(bytes.metrics["activation_peak_bytes"].get<double>(), 2.0 * kElements * 4);
  // The pass peak counts the region's bytes over what was held before it.
  EXPECT_EQ(bytes.metrics["pass_peak_bytes"].get<double>(), 3.0 * kElements * 4);
  EXPECT_GE(bytes.metrics["total_peak_bytes"].get<double>(), 4.0 * kElements * 4);
  EXPECT_FALSE(bytes.time.has_value());
}

TEST(SweepSupport, OutOfMemoryBecomesThePointsStatusAndOtherErrorsPropagate) {
  HR_TEST_DEVICE(dev, hr::BackendKind::cpu);
  hr::SweepPoint p = hr::props::sweep_point("TEST-SW", dev, hr::DType::f32, "none", {});
  const auto budget = dev.memory().budget();
  dev.memory().set_budget(dev.memory().snapshot().total_current_bytes + 1024);
  hr::props::measure_point(p, [&] { hr::Tensor t = hr::Tensor::zeros(dev, {kElements}, hr::DType::f32, hr::Consumer::activations); });
  dev.memory().set_budget(budget);
  EXPECT_EQ(p.status, "out_of_memory");
  EXPECT_FALSE(p.reason.empty());

  hr::SweepPoint q = hr::props::sweep_point("TEST-SW", dev, hr::DType::f32, "none", {});
  EXPECT_THROW(hr::props::measure_point(q, [] { throw hr::InvalidArgument("not a memory error"); }),
               hr::InvalidArgument);
  EXPECT_EQ(q.status, "ok");
}

}  // namespace
