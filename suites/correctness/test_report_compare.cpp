// Baseline comparison and the commands' exit codes: a matching pair is fit (0), a
// regressed pair is not (1), a baseline of another schema is bad input (2); the
// step-time decision rule (rank test, minimum effect, re-measurement) on synthetic
// sample sets, the older noise threshold for files without samples, the memory
// tolerance, check power, conformance failures, flags; and `run` end to end on the CPU.
#include <gtest/gtest.h>
#include <fmt/format.h>

#include <unistd.h>

#include <chrono>
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "harness/check.hpp"
#include "harness/cli/commands.hpp"
#include "harness/results/compare.hpp"
#include "harness/results/results.hpp"
#include "harness/properties/checkpoint_depth.hpp"
#include "harness/properties/microbatch_sweep.hpp"
#include "harness/properties/packing.hpp"
#include "harness/properties/sweep_support.hpp"
#include "harness/properties/trade.hpp"
#include "harness/timing.hpp"
#include "suites/common/test_support.hpp"

namespace {

namespace fs = std::filesystem;

std::string fixture(const char* name) {
  return (fs::path(__FILE__).parent_path() / ".." / ".." / "reports" / "testdata" / name).string();
}

hr::Results with_point(double median_s, double rel_spread, size_t peak_bytes) {
  hr::Results r;
  r.device = {{"backend", "cuda"}, {"name", "gpu"}, {"driver_version", 13000}};
  r.preset = "quick";
  hr::SweepPoint p;
  p.sweep = "BM-MB";
  p.backend = "cuda";
  p.dtype = "fp32";
  p.model = "mlp";
  p.config = {{"micro_batch", 4}};
  hr::TimeStats t;
  t.reps = 20;
  t.median_s = median_s;
  t.rel_spread = rel_spread;
  t.mad_s = median_s * rel_spread / 4;
  t.noisy = rel_spread > hr::kNoisyRelSpread;
  p.time = t;
  p.memory.peak_bytes[static_cast<int>(hr::Consumer::activations)] = peak_bytes;
  p.memory.total_peak_bytes = peak_bytes;
  r.sweep_points.push_back(p);
  r.measurements.push_back(hr::make_check("GA-1", "ok", 0, 1));
  hr::compute_totals(r);
  return r;
}

const hr::CompareRow* row(const hr::Comparison& c, const std::string& quantity) {
  for (const auto& r : c.rows)
    if (r.quantity == quantity) return &r;
  return nullptr;
}

TEST(ReportCompare, AChangeWithinTheCombinedNoiseIsTheSame) {
  // Spreads of 20% in both runs: a 15% slower median is within sqrt(0.2^2 + 0.2^2) = 28%.
  const auto c = hr::compare_results(with_point(0.100, 0.20, 1000), with_point(0.115, 0.20, 1000));
  ASSERT_NE(row(c, "step time"), nullptr);
  EXPECT_EQ(row(c, "step time")->verdict, "same");
  EXPECT_NEAR(row(c, "step time")->threshold, std::sqrt(0.08), 1e-9);
  EXPECT_TRUE(c.fit());
}

TEST(ReportCompare, AChangeBeyondTheNoiseIsARegression) {
  // Quiet runs (1% spread): the 5% floor decides, and 15% slower is beyond it.
  const auto c = hr::compare_results(with_point(0.100, 0.01, 1000), with_point(0.115, 0.01, 1000));
  EXPECT_EQ(row(c, "step time")->verdict, "regression");
  EXPECT_DOUBLE_EQ(row(c, "step time")->threshold, 0.05);
  EXPECT_FALSE(c.fit());
  EXPECT_EQ(c.regressions, 1);
  // Within the floor: the same. Faster beyond it: better, still fit.
  EXPECT_EQ(row(hr::compare_results(with_point(0.100, 0.01, 1000), with_point(0.104, 0.01, 1000)), "step time")->verdict,
            "same");
  const auto faster = hr::compare_results(with_point(0.100, 0.01, 1000), with_point(0.080, 0.01, 1000));
  EXPECT_EQ(row(faster, "step time")->verdict, "better");
  EXPECT_TRUE(faster.fit());
}

// Times through attention on other kernels are not the baseline's: not fit, and
// said so. A file that does not record them (CPU, or from before) is not held to it.
TEST(ReportCompare, OtherAttentionKernelsAreNotFit) {
  hr::Results base = with_point(0.100, 0.01, 1000), cur = with_point(0.100, 0.01, 1000);
  base.backend = cur.backend = "cuda";
  base.attention_kernel = cur.attention_kernel = "tensor_core";
  EXPECT_TRUE(hr::compare_results(base, cur).fit());
  cur.attention_kernel = "scalar";
  const auto c = hr::compare_results(base, cur);
  EXPECT_FALSE(c.fit());
  ASSERT_EQ(c.failures.size(), 1u);
  EXPECT_NE(c.failures[0].find("attention kernels differ: baseline tensor_core, this run scalar"), std::string::npos)
      << c.failures[0];
  // A run that does not record them is compared, with a warning that says so.
  cur.attention_kernel = "";
  const auto unsaid = hr::compare_results(base, cur);
  EXPECT_TRUE(unsaid.fit());
  EXPECT_TRUE(std::any_of(unsaid.warnings.begin(), unsaid.warnings.end(), [](const std::string& w) {
    return w.find("does not say which attention kernels") != std::string::npos;
  }));
}

// A point both runs timed on other attention kernels (a library that builds no
// graph for a shape on one machine falls back call by call) is said so in its row
// and in one warning; the same kernels, or a file that does not say, raise nothing.
TEST(ReportCompare, APointTimedOnOtherAttentionKernelsIsSaidSo) {
  auto with_kernels = [](std::map<std::string, double> calls) {
    hr::Results r = with_point(0.1, 0.01, 1000);
    r.sweep_points[0].time->kernel_calls = std::move(calls);
    return r;
  };
  const auto base = with_kernels({{"attention_forward:cudnn", 2}, {"attention_backward:cudnn", 2}});
  const auto other = hr::compare_results(
      base, with_kernels({{"attention_forward:scalar", 2}, {"attention_backward:scalar", 2}}));
  ASSERT_NE(row(other, "step time"), nullptr);
  EXPECT_NE(row(other, "step time")->note.find("attention kernels: baseline cudnn; this run scalar"),
            std::string::npos)
      << row(other, "step time")->note;
  auto warned = [](const hr::Comparison& c) {
    return std::count_if(c.warnings.begin(), c.warnings.end(), [](const std::string& w) {
      return w.find("timed other attention kernels than the baseline's") != std::string::npos;
    });
  };
  EXPECT_EQ(warned(other), 1);
  // Where this run says why it fell back, its row says so too.
  auto fell = with_kernels({{"attention_forward:scalar", 2}, {"attention_backward:scalar", 2}});
  fell.sweep_points[0].time->kernel_fallbacks = {{"attention_forward:cudnn", "no graph for this shape"},
                                                 {"attention_backward:cudnn", "no graph for this shape"}};
  const auto said = hr::compare_results(base, fell);
  ASSERT_NE(row(said, "step time"), nullptr);
  EXPECT_NE(row(said, "step time")->note.find("this run scalar (cudnn asked: no graph for this shape)"),
            std::string::npos)
      << row(said, "step time")->note;
  // And where the baseline fell back, so does the baseline's.
  const auto before = hr::compare_results(fell, base);
  ASSERT_NE(row(before, "step time"), nullptr);
  EXPECT_NE(row(before, "step time")->note.find(
                "baseline scalar (cudnn asked: no graph for this shape); this run cudnn"),
            std::string::npos)
      << row(before, "step time")->note;
  // One direction on another kernel is enough to differ, and so are the same two
  // kernels in the other directions.
  EXPECT_EQ(warned(hr::compare_results(
                base, with_kernels({{"attention_forward:cudnn", 2}, {"attention_backward:scalar", 2}}))),
            1);
  EXPECT_EQ(warned(hr::compare_results(
                with_kernels({{"attention_forward:scalar", 2}, {"attention_backward:cudnn", 2}}),
                with_kernels({{"attention_forward:cudnn", 2}, {"attention_backward:scalar", 2}}))),
            1);
  EXPECT_EQ(warned(hr::compare_results(base, base)), 0);
  EXPECT_EQ(warned(hr::compare_results(base, with_point(0.1, 0.01, 1000))), 0);
}

// ---- The step-time decision rule on synthetic sample sets ----------------------------

// n step times drawn around median_s with relative log-normal noise sigma, of which
// drift_n are multiplied by drift (a shared machine's burst of other work).
// Box-Muller over mt19937_64, so the sets are the same on every platform.
std::vector<double> draw_times(uint64_t seed, int n, double median_s, double sigma, int drift_n = 0,
                               double drift = 1) {
  std::mt19937_64 gen(seed);
  auto uniform = [&] { return (static_cast<double>(gen() >> 11) + 0.5) * 0x1.0p-53; };
  std::vector<double> s;
  for (int i = 0; i < n; ++i) {
    const double z = std::sqrt(-2 * std::log(uniform())) * std::cos(2 * M_PI * uniform());
    s.push_back(median_s * std::exp(sigma * z) * (i < drift_n ? drift : 1.0));
  }
  return s;
}

hr::Results with_samples(const std::vector<double>& samples_s) {
  auto r = with_point(0.1, 0.01, 1000);
  r.sweep_points[0].time = hr::summarize_times(samples_s);
  return r;
}

// A remeasure hook that draws a fresh sample set, as validate's re-measurement would.
// `host`: what the host did meanwhile (not read, by default).
hr::Remeasure remeasure_with(std::function<std::vector<double>()> draw, int* calls,
                             std::optional<hr::HostLoad> host = std::nullopt) {
  return [draw, calls, host](const hr::SweepPoint& p) -> std::optional<hr::Remeasured> {
    ++*calls;
    hr::SweepPoint again = p;
    again.time = hr::summarize_times(draw());
    return hr::Remeasured{again, host};
  };
}

// Files without samples: a noisy baseline (trusted) makes a change noisy; the judged
// file's own claim of a wide spread, with no samples behind it, does not.
TEST(ReportCompare, ANoisyTimingIsFlaggedNotJudged) {
  const auto c = hr::compare_results(with_point(0.100, 0.40, 1000), with_point(0.200, 0.01, 1000));
  EXPECT_EQ(row(c, "step time")->verdict, "noisy");
  EXPECT_TRUE(c.fit());
  EXPECT_EQ(c.noisy, 1);
  EXPECT_FALSE(c.warnings.empty());
  const auto claimed = hr::compare_results(with_point(0.100, 0.01, 1000), with_point(0.200, 0.40, 1000));
  EXPECT_EQ(row(claimed, "step time")->verdict, "regression") << row(claimed, "step time")->note;
  EXPECT_FALSE(claimed.fit());
  // Where the judged run's samples back its spread, its noise counts: twice the
  // median over samples spread from 0.12 to 0.28 s.
  auto backed = with_samples({0.12, 0.14, 0.16, 0.18, 0.2, 0.22, 0.24, 0.26, 0.28});
  ASSERT_TRUE(backed.sweep_points[0].time->noisy);
  auto old_b = with_point(0.100, 0.01, 1000);
  EXPECT_EQ(row(hr::compare_results(old_b, backed), "step time")->verdict, "noisy");
}

// A baseline that recorded its repetitions holds this run to a test over samples;
// a judged file without them would be held to its own summary instead: a
// regression, saying why. The control: with its samples, the same run is the same.
TEST(ReportCompare, ARunWithoutSamplesAgainstABaselineWithThemIsNotJudgedOnItsSummary) {
  const auto base = with_samples(draw_times(1, 10, 0.1, 0.02));
  auto cur = with_samples(draw_times(2, 10, 0.1, 0.02));
  EXPECT_EQ(row(hr::compare_results(base, cur), "step time")->verdict, "same");
  cur.sweep_points[0].time->samples_s.clear();
  const auto c = hr::compare_results(base, cur);
  EXPECT_EQ(row(c, "step time")->verdict, "regression");
  EXPECT_NE(row(c, "step time")->note.find("recorded none to test against them"), std::string::npos)
      << row(c, "step time")->note;
  EXPECT_FALSE(c.fit());
  // A busy baseline host (a trusted record) loosens judged changes, not this: there
  // is nothing to judge.
  auto busy_base = base;
  busy_base.host = hr::test::busy_host_load();
  ASSERT_TRUE(busy_base.host->busy());
  const auto b = hr::compare_results(busy_base, cur);
  EXPECT_TRUE(b.host_busy);
  EXPECT_EQ(row(b, "step time")->verdict, "regression") << row(b, "step time")->note;
  EXPECT_FALSE(b.fit());
}

// The summary read from a file is that of its samples: a median that is not theirs
// is refused; the spread and "noisy" come from the samples, not the file's claim.
TEST(ReportCompare, ATimeSummaryIsThatOfItsSamples) {
  const auto r = with_samples({0.10, 0.11, 0.12, 0.10, 0.13});
  auto j = hr::results_to_json(r);
  EXPECT_NO_THROW(hr::results_from_json(j));
  j["sweep_points"][0]["time"]["median_s"] = 0.055;  // half the samples' median
  EXPECT_THROW(hr::results_from_json(j), hr::InvalidArgument);
  j = hr::results_to_json(r);
  j["sweep_points"][0]["time"]["noisy"] = true;
  j["sweep_points"][0]["time"]["rel_spread"] = 0.9;
  const auto back = hr::results_from_json(j);
  EXPECT_FALSE(back.sweep_points[0].time->noisy);
  EXPECT_DOUBLE_EQ(back.sweep_points[0].time->rel_spread, r.sweep_points[0].time->rel_spread);
}

TEST(ReportCompare, MannWhitneyUAgainstHandComputedValues) {
  // Fully separated samples of 3: U = 0, p = erfc(4 / sqrt(5.25) / sqrt(2)) = 0.0809
  // (continuity-corrected normal approximation, as scipy's method="asymptotic").
  const auto t = hr::mann_whitney_u({1, 2, 3}, {4, 5, 6});
  EXPECT_DOUBLE_EQ(t.u_a, 0);
  EXPECT_NEAR(t.p_two_sided, 0.0809, 1e-4);
  EXPECT_LT(t.z, 0);
  EXPECT_NEAR(hr::mann_whitney_u({4, 5, 6}, {1, 2, 3}).p_two_sided, 0.0809, 1e-4);
  // Ties: a = {1, 2, 2}, b = {2, 3}; U_a by counting pairs = 1 (two ties of 1/2);
  // tie-corrected variance 6/12 * (6 - 24/20) = 2.4, p = erfc(1.5 / sqrt(2.4) / sqrt(2)).
  const std::vector<double> a{1, 2, 2}, b{2, 3};
  double pairs = 0;
  for (double x : a)
    for (double y : b) pairs += x > y ? 1.0 : x == y ? 0.5 : 0.0;
  const auto tied = hr::mann_whitney_u(a, b);
  EXPECT_DOUBLE_EQ(tied.u_a, pairs);
  EXPECT_NEAR(tied.p_two_sided, 0.33292, 1e-4);
  // Every sample equal: no evidence.
  EXPECT_DOUBLE_EQ(hr::mann_whitney_u({1, 1, 1}, {1, 1}).p_two_sided, 1.0);
  // 20 against 20 separated: far below any level used.
  EXPECT_LT(hr::mann_whitney_u(draw_times(1, 20, 0.2, 0.03), draw_times(2, 20, 0.1, 0.03)).p_two_sided, 1e-6);
}

// kMinJudgedReps is the fewest samples a side with which the rank test can call a
// point slower at the default --time-alpha: one fewer, every sample apart, cannot.
TEST(ReportCompare, TheFewestJudgedSamplesCanReachTheTimeAlpha) {
  const double alpha = hr::CompareOptions{}.time_alpha;
  auto separated = [](int n) {
    std::vector<double> fast, slow;
    for (int i = 0; i < n; ++i) fast.push_back(1.0 + 0.01 * i), slow.push_back(2.0 + 0.01 * i);
    return hr::mann_whitney_u(slow, fast).p_two_sided;
  };
  EXPECT_LT(separated(hr::kMinJudgedReps), alpha);
  EXPECT_GE(separated(hr::kMinJudgedReps - 1), alpha);
}

// Every timed sweep takes at least kMinJudgedReps samples a point at either preset
// (on the CPU and on a GPU), so that validate can judge each one slower: a sweep
// timed fewer times would pass any slowdown of its points as noisy.
TEST(ReportCompare, EveryTimedSweepTakesEnoughSamplesToBeJudged) {
  using hr::BackendKind;
  using hr::Preset;
  EXPECT_GE(hr::TimingOptions{}.min_reps, hr::kMinJudgedReps) << "the default timing";
  EXPECT_GE(hr::props::trade_timing().min_reps, hr::kMinJudgedReps) << "TRADE";
  for (Preset preset : {Preset::quick, Preset::full}) {
    EXPECT_GE(hr::props::pk_bench_timing(preset).min_reps, hr::kMinJudgedReps)
        << "BM-PK, BM-SEQ, PK-4 at " << hr::preset_name(preset);
    for (BackendKind backend : {BackendKind::cpu, BackendKind::cuda}) {
      EXPECT_GE(hr::props::checkpoint_bench_config(preset, backend).timing.min_reps, hr::kMinJudgedReps)
          << "BM-CK at " << hr::preset_name(preset);
      EXPECT_GE(hr::props::microbatch_sweep_config(preset, backend).timing.min_reps, hr::kMinJudgedReps)
          << "BM-MB at " << hr::preset_name(preset);
    }
  }
}

TEST(ReportCompare, FewSamplesShiftedByAThirdAreUndecidableNotARegression) {
  // The shared 2-core machine's case: three samples a run, this run's 30% slower.
  // The old rule (a threshold from each run's own small spread) called it a
  // regression; three samples cannot decide it (the smallest two-sided p of 3 vs 3
  // is 0.08), so it is noisy.
  const std::vector<double> base{0.100, 0.101, 0.102}, cur{0.130, 0.131, 0.132};
  const auto c = hr::compare_results(with_samples(base), with_samples(cur));
  ASSERT_NE(row(c, "step time"), nullptr);
  EXPECT_EQ(row(c, "step time")->verdict, "noisy") << row(c, "step time")->note;
  EXPECT_TRUE(c.fit());
  EXPECT_EQ(c.noisy, 1);
  // The same statistics without their samples fall back to the older rule, which
  // calls it a regression: the rank test is what changed the verdict.
  auto old_b = with_samples(base), old_c = with_samples(cur);
  old_b.sweep_points[0].time->samples_s.clear();
  old_c.sweep_points[0].time->samples_s.clear();
  EXPECT_EQ(row(hr::compare_results(old_b, old_c), "step time")->verdict, "regression");
}

TEST(ReportCompare, DriftInAMinorityOfSamplesIsNotARegression) {
  // 7 of this run's 20 samples 30% slower (other work on the machine), at 3% noise;
  // the baseline had 2 such of its own. The median barely moves and the ranks
  // overlap: mostly the same; the few draws judged slower at first (the median up
  // just past the 5% minimum effect) are not confirmed by a re-measurement with
  // drift of its own. Never a regression, over 200 draws.
  int regressions = 0, same = 0, suspected = 0;
  for (uint64_t seed = 1; seed <= 200; ++seed) {
    const auto base = with_samples(draw_times(seed, 20, 0.1, 0.03, 2, 1.3));
    const auto cur = with_samples(draw_times(seed + 1000, 20, 0.1, 0.03, 7, 1.3));
    const auto first = hr::compare_results(base, cur);
    suspected += row(first, "step time")->verdict == "regression";
    same += row(first, "step time")->verdict == "same";
    int calls = 0;
    const auto c = hr::compare_results(
        base, cur, {}, remeasure_with([&] { return draw_times(seed + 2000, 20, 0.1, 0.03, 7, 1.3); }, &calls));
    regressions += row(c, "step time")->verdict == "regression";
  }
  EXPECT_EQ(regressions, 0);
  EXPECT_LE(suspected, 4);  // the rank test alone lets through ~1%
  EXPECT_GT(same, 150);     // mostly judged, not waved through as noisy
}

TEST(ReportCompare, TwoNoisyRunsOfTheSameSpeedAreNotARegression) {
  // Both runs with 25% log-normal noise and the same median: the medians of 10
  // samples differ by chance, often beyond the 5% minimum effect; with validate's
  // re-measurement (a fresh draw of the same speed) none is called a regression.
  int regressions = 0, suspected = 0, remeasured = 0;
  for (uint64_t seed = 1; seed <= 200; ++seed) {
    const auto base = with_samples(draw_times(seed, 10, 0.1, 0.25));
    const auto cur = with_samples(draw_times(seed + 1000, 10, 0.1, 0.25));
    suspected += row(hr::compare_results(base, cur), "step time")->verdict == "regression";
    int calls = 0;
    uint64_t again = seed + 2000;
    const auto c = hr::compare_results(base, cur, {}, remeasure_with([&] { return draw_times(again++, 10, 0.1, 0.25); }, &calls));
    regressions += row(c, "step time")->verdict == "regression";
    remeasured += calls;
  }
  EXPECT_EQ(regressions, 0);
  EXPECT_EQ(remeasured, suspected);  // only the suspected points are measured again
}

TEST(ReportCompare, ACleanTwofoldSlowdownIsARegression) {
  for (uint64_t seed = 1; seed <= 50; ++seed) {
    const auto base = with_samples(draw_times(seed, 10, 0.1, 0.03));
    const auto cur = with_samples(draw_times(seed + 1000, 10, 0.2, 0.03));
    // From files (no re-measurement possible): the rank test and the effect decide.
    const auto files = hr::compare_results(base, cur);
    EXPECT_EQ(row(files, "step time")->verdict, "regression");
    EXPECT_LT(row(files, "step time")->p_value, 1e-3);
    // In validate: re-measured, still twice as slow, confirmed.
    int calls = 0;
    const auto c = hr::compare_results(base, cur, {},
                                       remeasure_with([&] { return draw_times(seed + 2000, 10, 0.2, 0.03); }, &calls));
    EXPECT_EQ(calls, 1);
    ASSERT_EQ(row(c, "step time")->verdict, "regression") << row(c, "step time")->note;
    EXPECT_NEAR(row(c, "step time")->remeasured_change, 1.0, 0.1);
    EXPECT_FALSE(c.fit());
    ASSERT_EQ(c.failures.size(), 1u);
    EXPECT_NE(c.failures[0].find("micro_batch=4"), std::string::npos) << c.failures[0];
    EXPECT_NE(c.failures[0].find("confirmed on re-measurement"), std::string::npos) << c.failures[0];
  }
}

// BM-DP's host MPI times are shown, not judged: a clean twofold slowdown there is
// noisy, where the same samples on a BM-MB point are a regression (above).
TEST(ReportCompare, HostMpiTimesAreShownNotJudged) {
  auto as_dp = [](hr::Results r) {
    for (auto& p : r.sweep_points) {
      p.sweep = "BM-DP";
      p.backend = "cpu";
    }
    return r;
  };
  const auto base = as_dp(with_samples(draw_times(1, 10, 0.1, 0.03)));
  const auto cur = as_dp(with_samples(draw_times(1001, 10, 0.2, 0.03)));
  const auto c = hr::compare_results(base, cur);
  ASSERT_NE(row(c, "step time"), nullptr);
  EXPECT_EQ(row(c, "step time")->verdict, "noisy");
  EXPECT_NE(row(c, "step time")->note.find("not judged"), std::string::npos);
  EXPECT_NEAR(row(c, "step time")->change, 1.0, 0.15);
  EXPECT_TRUE(c.fit());
}

TEST(ReportCompare, ASlowdownTheReMeasurementDoesNotConfirmIsNoisy) {
  // The run was 40% slower for all its samples (the machine was busy), the
  // re-measurement is back at the baseline's speed: the machine drifted.
  const auto base = with_samples(draw_times(1, 10, 0.1, 0.03));
  const auto cur = with_samples(draw_times(2, 10, 0.14, 0.03));
  int calls = 0;
  const auto c = hr::compare_results(base, cur, {}, remeasure_with([] { return draw_times(3, 10, 0.1, 0.03); }, &calls));
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(row(c, "step time")->verdict, "noisy");
  EXPECT_NE(row(c, "step time")->note.find("drifted"), std::string::npos) << row(c, "step time")->note;
  EXPECT_TRUE(c.fit());
  EXPECT_EQ(c.remeasured, 1);
  EXPECT_EQ(c.drifted, 1);
  std::string all;
  for (const auto& w : c.warnings) all += w + "\n";
  EXPECT_NE(all.find("did not stay slower on re-measurement"), std::string::npos) << all;
  // A hook that cannot re-measure leaves the first judgement, and says so.
  const auto none = hr::compare_results(base, cur, {}, [](const hr::SweepPoint&) { return std::nullopt; });
  EXPECT_EQ(row(none, "step time")->verdict, "regression");
  EXPECT_NE(row(none, "step time")->note.find("not re-measured"), std::string::npos);
}

// A re-measurement taken while other work held the host is judged as loosely as a
// run on a busy host: 40% slower in the run and again on re-measurement is a
// regression where the host was quiet meanwhile, and too noisy to judge where it
// was busy (within the busy host's 75%). Twice as slow (gross) and 85% slower
// (subtle: 10 points past the busy host's minimum effect) stay regressions on a
// busy host.
TEST(ReportCompare, AReMeasurementOnABusyHostIsJudgedAsOnABusyRun) {
  hr::HostLoad quiet_host = hr::test::busy_host_load();
  quiet_host.other_busy_cpus = 0.1;
  ASSERT_FALSE(quiet_host.busy());
  ASSERT_TRUE(hr::test::busy_host_load().busy());
  const auto base = with_samples(draw_times(1, 10, 0.1, 0.03));
  const auto cur = with_samples(draw_times(2, 10, 0.14, 0.03));
  int drifted = 0;
  auto judged = [&](double remeasured_s, const hr::HostLoad& host) {
    int calls = 0;
    const auto c = hr::compare_results(
        base, cur, {}, remeasure_with([=] { return draw_times(3, 10, remeasured_s, 0.03); }, &calls, host));
    EXPECT_EQ(calls, 1);
    drifted = c.drifted;
    return *row(c, "step time");
  };
  const hr::CompareRow quiet = judged(0.14, quiet_host);
  EXPECT_EQ(quiet.verdict, "regression") << quiet.note;
  const hr::CompareRow busy = judged(0.14, hr::test::busy_host_load());
  EXPECT_EQ(busy.verdict, "noisy") << busy.note;
  EXPECT_NE(busy.note.find("re-measurement: 2 CPUs, 1.5 busy with other work"), std::string::npos) << busy.note;
  EXPECT_EQ(drifted, 0) << "still slower on a busy host is not drift";
  // Back at the baseline's speed on re-measurement, busy host or not: drift.
  EXPECT_EQ(judged(0.1, hr::test::busy_host_load()).verdict, "noisy");
  EXPECT_EQ(drifted, 1);
  for (double slower : {1.85, 2.0}) {
    const hr::CompareRow still = judged(0.1 * slower, hr::test::busy_host_load());
    EXPECT_EQ(still.verdict, "regression") << slower << "x on a busy host: " << still.note;
  }
}

TEST(ReportCompare, ASmallSignificantChangeIsTheSameAndFasterIsBetter) {
  // 3% slower with 1% noise: significant, but within the 5% minimum effect.
  const auto small = hr::compare_results(with_samples(draw_times(1, 20, 0.100, 0.01)),
                                         with_samples(draw_times(2, 20, 0.103, 0.01)));
  EXPECT_LT(row(small, "step time")->p_value, 0.01);
  EXPECT_EQ(row(small, "step time")->verdict, "same");
  const auto faster = hr::compare_results(with_samples(draw_times(1, 10, 0.1, 0.03)),
                                          with_samples(draw_times(2, 10, 0.07, 0.03)));
  EXPECT_EQ(row(faster, "step time")->verdict, "better");
  EXPECT_TRUE(faster.fit());
}

TEST(ReportCompare, OnTheCpuTheCpuTimeIsJudged) {
  // A CPU point: the wall clock twice as long (the machine busy with other work),
  // the CPU time per step unchanged: the same. The CPU time doubled: a regression.
  auto cpu_point = [](uint64_t seed, double wall_s, double cpu_s) {
    auto r = with_samples(draw_times(seed, 10, wall_s, 0.2));
    r.sweep_points[0].time->cpu_samples_s = draw_times(seed + 500, 10, cpu_s, 0.03);
    return r;
  };
  const auto busy = hr::compare_results(cpu_point(1, 0.1, 0.05), cpu_point(2, 0.2, 0.05));
  ASSERT_NE(row(busy, "step cpu time"), nullptr);
  EXPECT_EQ(row(busy, "step time"), nullptr);
  EXPECT_EQ(row(busy, "step cpu time")->verdict, "same");
  EXPECT_NEAR(row(busy, "step cpu time")->baseline, 0.05, 0.005);
  EXPECT_TRUE(busy.fit());
  const auto slower = hr::compare_results(cpu_point(1, 0.1, 0.05), cpu_point(2, 0.1, 0.1));
  EXPECT_EQ(row(slower, "step cpu time")->verdict, "regression");
  ASSERT_FALSE(slower.failures.empty());
  EXPECT_NE(slower.failures[0].find("CPU-time samples"), std::string::npos) << slower.failures[0];
  const std::string text = hr::format_comparison_text(cpu_point(1, 0.1, 0.05), cpu_point(2, 0.1, 0.1), slower);
  EXPECT_NE(text.find(" ms cpu ("), std::string::npos) << text;
  // Only one run with CPU time (an older file): the wall-clock samples are judged.
  auto old = cpu_point(1, 0.1, 0.05);
  old.sweep_points[0].time->cpu_samples_s.clear();
  EXPECT_NE(row(hr::compare_results(old, cpu_point(2, 0.1, 0.05)), "step time"), nullptr);
}

// CPU time has a floor of its own (CompareOptions::cpu_time_floor, 40%): a clear 30%
// shift is the same there and a regression in device time; 50% is a regression in
// both; a given --time-floor sets both.
TEST(ReportCompare, CpuTimeHasItsOwnMinimumEffect) {
  auto cpu_point = [](uint64_t seed, double cpu_s) {
    auto r = with_samples(draw_times(seed, 10, 0.1, 0.2));
    r.sweep_points[0].time->cpu_samples_s = draw_times(seed + 500, 10, cpu_s, 0.005);
    return r;
  };
  auto device_point = [](uint64_t seed, double s) { return with_samples(draw_times(seed, 10, s, 0.005)); };
  const auto cpu30 = hr::compare_results(cpu_point(1, 0.05), cpu_point(2, 0.065));
  EXPECT_LT(row(cpu30, "step cpu time")->p_value, 0.01);
  EXPECT_EQ(row(cpu30, "step cpu time")->verdict, "same");
  EXPECT_EQ(row(hr::compare_results(device_point(1, 0.05), device_point(2, 0.065)), "step time")->verdict,
            "regression");
  EXPECT_EQ(row(hr::compare_results(cpu_point(1, 0.05), cpu_point(2, 0.075)), "step cpu time")->verdict,
            "regression");
  hr::CompareOptions tight;
  tight.time_floor = tight.cpu_time_floor = 0.05;  // what --time-floor 0.05 sets
  EXPECT_EQ(row(hr::compare_results(cpu_point(1, 0.05), cpu_point(2, 0.054), tight), "step cpu time")->verdict,
            "regression");
}

TEST(ReportCompare, OnTheCpuStepsAreJudgedRelativeToTheReferenceWork) {
  // Each repetition sees the machine at some speed (10% log-normal, times machine):
  // the step's CPU time (work_s, 2% noise of its own) and the reference work's right
  // after it (8 ms) both scale with it.
  auto point = [](uint64_t seed, double work_s, double machine) {
    const auto speed = draw_times(seed, 10, machine, 0.10);
    const auto step_noise = draw_times(seed + 500, 10, 1.0, 0.02), ref_noise = draw_times(seed + 700, 10, 1.0, 0.02);
    auto r = with_samples(draw_times(seed + 900, 10, 1.5 * work_s * machine, 0.2));
    auto& t = *r.sweep_points[0].time;
    for (int i = 0; i < 10; ++i) {
      t.cpu_samples_s.push_back(work_s * speed[i] * step_noise[i]);
      t.ref_cpu_samples_s.push_back(0.008 * speed[i] * ref_noise[i]);
    }
    return r;
  };
  for (uint64_t seed = 1; seed <= 50; ++seed) {
    // The machine 70% slower during this run (a busy sibling hyperthread), the same
    // work: the same, where the CPU time alone calls it a regression.
    const auto busy = hr::compare_results(point(seed, 0.1, 1.0), point(seed + 1000, 0.1, 1.7));
    EXPECT_EQ(row(busy, "step cpu time")->verdict, "same") << row(busy, "step cpu time")->note;
    EXPECT_NEAR(row(busy, "step cpu time")->current, 0.1, 0.01);  // at the baseline's speed
    auto without = point(seed + 1000, 0.1, 1.7);
    without.sweep_points[0].time->ref_cpu_samples_s.clear();
    EXPECT_EQ(row(hr::compare_results(point(seed, 0.1, 1.0), without), "step cpu time")->verdict, "regression");
    // Twice the work, on a machine twice as fast: the CPU time is unchanged, the
    // step relative to the reference doubled: a regression.
    const auto hidden = hr::compare_results(point(seed, 0.1, 1.0), point(seed + 1000, 0.2, 0.5));
    EXPECT_EQ(row(hidden, "step cpu time")->verdict, "regression");
    ASSERT_FALSE(hidden.failures.empty());
    EXPECT_NE(hidden.failures[0].find("relative to the reference work"), std::string::npos) << hidden.failures[0];
  }
}

// A ratio to one reference work is not a ratio to another: where the two runs name
// different works (a file from before the reference was named ran another), the
// CPU time alone is judged, and the note says why.
TEST(ReportCompare, OnlyRatiosToTheSameReferenceWorkAreCompared) {
  // The step's CPU time 0.1 s in both; the reference took 8 ms in the baseline and
  // 4 ms in this run, as a smaller reference would on the same machine.
  auto point = [](uint64_t seed, double ref_s, const std::string& ref_work) {
    auto r = with_samples(draw_times(seed, 10, 0.15, 0.2));
    auto& t = *r.sweep_points[0].time;
    t.cpu_samples_s = draw_times(seed + 500, 10, 0.1, 0.01);
    t.ref_cpu_samples_s = draw_times(seed + 700, 10, ref_s, 0.01);
    t.ref_work = ref_work;
    return r;
  };
  const auto other = hr::compare_results(point(1, 0.008, ""), point(2, 0.004, hr::reference_work_name()));
  EXPECT_EQ(row(other, "step cpu time")->verdict, "same") << row(other, "step cpu time")->note;
  EXPECT_NEAR(row(other, "step cpu time")->current, 0.1, 0.005);
  // Said once for the run, with both works, even where the verdict is "same".
  auto warned = [](const hr::Comparison& c) {
    return std::count_if(c.warnings.begin(), c.warnings.end(), [](const std::string& w) {
      return w.find("judged on CPU time alone, not relative to the reference work") != std::string::npos;
    });
  };
  EXPECT_EQ(warned(other), 1);
  EXPECT_TRUE(std::any_of(other.warnings.begin(), other.warnings.end(), [](const std::string& w) {
    return w.find("baseline: unnamed") != std::string::npos && w.find(hr::reference_work_name()) != std::string::npos;
  }));
  // One run without reference samples at all: the CPU time alone, said the same way.
  auto none = point(2, 0.004, "");
  none.sweep_points[0].time->ref_cpu_samples_s.clear();
  const auto one_sided = hr::compare_results(point(1, 0.008, hr::reference_work_name()), none);
  EXPECT_EQ(row(one_sided, "step cpu time")->verdict, "same") << row(one_sided, "step cpu time")->note;
  EXPECT_EQ(warned(one_sided), 1);
  const auto j = hr::judge_step_time(*point(1, 0.008, "").sweep_points[0].time,
                                     *point(2, 0.004, hr::reference_work_name()).sweep_points[0].time);
  EXPECT_TRUE(j.reference_differs);
  EXPECT_FALSE(j.relative_to_reference);
  // The control: the same two runs naming the same work are divided by it, and the
  // halved reference reads as a step twice as slow.
  const auto same =
      hr::compare_results(point(1, 0.008, hr::reference_work_name()), point(2, 0.004, hr::reference_work_name()));
  EXPECT_EQ(row(same, "step cpu time")->verdict, "regression");
  EXPECT_EQ(warned(same), 0);
  ASSERT_FALSE(same.failures.empty());
  EXPECT_NE(same.failures[0].find("relative to the reference work"), std::string::npos) << same.failures[0];
}

TEST(ReportCompare, TheReferenceWorkIsRecordedOnRequest) {
  auto dev = hr::make_device("cpu");
  std::mt19937 gen(11);
  std::vector<float> x(4096);
  auto region = [&] {
    for (auto& v : x) v = v * 0.5f + static_cast<float>(gen() % 7);
  };
  hr::TimingOptions opt;
  opt.warmup = 0;
  opt.min_reps = opt.max_reps = 5;
  const hr::props::OneBlasThread one_blas_thread(*dev);
  EXPECT_TRUE(hr::time_region(*dev, region, opt).ref_cpu_samples_s.empty());
  opt.reference_work = true;
  const auto t = hr::time_region(*dev, region, opt);
  ASSERT_EQ(t.ref_cpu_samples_s.size(), 5u);
  for (double s : t.ref_cpu_samples_s) EXPECT_GT(s, 0);
  EXPECT_EQ(t.ref_work, hr::reference_work_name());
}

TEST(ReportCompare, SamplesSurviveResultsJson) {
  auto r = with_samples({0.1, 0.11, 0.12});
  r.sweep_points[0].time->cpu_samples_s = {0.05, 0.06, 0.07};
  r.sweep_points[0].time->ref_cpu_samples_s = {0.008, 0.009, 0.007};
  r.sweep_points[0].time->ref_work = hr::reference_work_name();
  const auto back = hr::results_from_json(hr::results_to_json(r));
  ASSERT_TRUE(back.sweep_points[0].time.has_value());
  EXPECT_EQ(back.sweep_points[0].time->samples_s, (std::vector<double>{0.1, 0.11, 0.12}));
  EXPECT_EQ(back.sweep_points[0].time->cpu_samples_s, (std::vector<double>{0.05, 0.06, 0.07}));
  EXPECT_EQ(back.sweep_points[0].time->ref_cpu_samples_s, (std::vector<double>{0.008, 0.009, 0.007}));
  EXPECT_EQ(back.sweep_points[0].time->ref_work, hr::reference_work_name());
  // A name without reference samples, or a name that is not one, is refused.
  auto j = hr::results_to_json(r);
  j["sweep_points"][0]["time"].erase("ref_cpu_samples_s");
  EXPECT_THROW(hr::results_from_json(j), hr::InvalidArgument);
  j = hr::results_to_json(r);
  j["sweep_points"][0]["time"]["ref_work"] = 3;
  EXPECT_THROW(hr::results_from_json(j), hr::InvalidArgument);
}

// ---- Fault injection ----------------------------------------------------------------

TEST(ReportCompare, InjectedSlowdownNamesItsPoints) {
  const nlohmann::json mb4{{"micro_batch", 4}, {"accum_steps", 8}, {"optimizer", "adamw"}};
  const nlohmann::json mb8{{"micro_batch", 8}, {"accum_steps", 4}, {"optimizer", "adamw"}};
  EXPECT_DOUBLE_EQ(hr::injected_slowdown("BM-MB:micro_batch=4:2", "BM-MB", mb4), 2.0);
  EXPECT_DOUBLE_EQ(hr::injected_slowdown("BM-MB:micro_batch=4:2", "BM-MB", mb8), 1.0);
  EXPECT_DOUBLE_EQ(hr::injected_slowdown("BM-MB:micro_batch=4:2", "BM-SEQ", mb4), 1.0);
  EXPECT_DOUBLE_EQ(hr::injected_slowdown("BM-MB:1.5", "BM-MB", mb8), 1.5);
  EXPECT_DOUBLE_EQ(hr::injected_slowdown("BM-MB:micro_batch=4,optimizer=adamw:3;BM-MB:2.5", "BM-MB", mb4), 3.0);
  EXPECT_DOUBLE_EQ(hr::injected_slowdown("BM-MB:micro_batch=4,optimizer=adamw:3;BM-MB:2.5", "BM-MB", mb8), 2.5);
  EXPECT_DOUBLE_EQ(hr::injected_slowdown("", "BM-MB", mb4), 1.0);
  EXPECT_THROW(hr::injected_slowdown("BM-MB:micro_batch=4:fast", "BM-MB", mb4), hr::InvalidArgument);
  EXPECT_THROW(hr::injected_slowdown("BM-MB:micro_batch=4:0.5", "BM-MB", mb4), hr::InvalidArgument);
  EXPECT_THROW(hr::injected_slowdown("BM-MB", "BM-MB", mb4), hr::InvalidArgument);
  EXPECT_THROW(hr::injected_slowdown("BM-MB:micro_batch:2", "BM-MB", mb4), hr::InvalidArgument);
}

TEST(ReportCompare, InjectedSlowdownSlowsTheTimedRegion) {
  // A region that burns 1-2 ms of its thread's CPU time and then sleeps 2-3 ms
  // (random, non-zero): the factor makes each repetition its run plus a wait of
  // (factor - 1) times that run, in CPU time and in wall-clock time alike, the
  // region running once. The lower bounds are from what the run asked for, which a
  // loaded machine can only lengthen: a sleep never ends early, and a spin that
  // must burn CPU time takes at least that much wall time. A factor not applied
  // (one run, no wait) falls below each of them. The CPU time also has an upper
  // bound, which load does not move (the spins stop at a CPU time): a wait of the
  // factor rather than the factor less one, or a second run, passes it.
  auto dev = hr::make_device("cpu");
  std::mt19937 gen(7);
  std::uniform_int_distribution<int> spin_us(1000, 2000), sleep_us(2000, 3000);
  std::vector<double> asked_cpu, asked_wall;  // each call's CPU time and its whole time, in seconds
  auto region = [&] {
    const int spin = spin_us(gen), sleep = sleep_us(gen);
    asked_cpu.push_back(spin * 1e-6);
    asked_wall.push_back((spin + sleep) * 1e-6);
    const double until = hr::thread_cpu_seconds() + spin * 1e-6;
    while (hr::thread_cpu_seconds() < until) {
    }
    std::this_thread::sleep_for(std::chrono::microseconds(sleep));
  };
  hr::TimingOptions opt;
  opt.warmup = 0;
  opt.min_reps = opt.max_reps = 8;
  const hr::props::OneBlasThread one_blas_thread(*dev);
  // The timer and the sleeps read the same steady clock; 1% for its granularity.
  constexpr double kClockSlack = 0.99;

  size_t first = 0;  // the first call of the timing under test
  for (const double factor : {1.0, 2.0, 1.5}) {
    SCOPED_TRACE(fmt::format("factor {}", factor));
    opt.injected_slowdown = factor;
    const hr::TimeStats t = hr::time_region(*dev, region, opt);
    ASSERT_EQ(asked_wall.size(), first + 8u);  // the region once per repetition
    ASSERT_EQ(t.samples_s.size(), 8u);
    ASSERT_EQ(t.cpu_samples_s.size(), 8u);
    for (size_t r = 0; r < 8; ++r) {
      const double wall = asked_wall.at(first + r), cpu = asked_cpu.at(first + r);
      EXPECT_GE(t.samples_s[r], kClockSlack * factor * wall) << "repetition " << r;
      // The wait spins first, so the CPU time sees it too, unless the spin's
      // wall-clock cap (ten waits past the wait) ended it first, which only a
      // machine too loaded to give the thread a tenth of a core does: a repetition
      // shorter than the cap's moment did not reach it.
      if (factor == 1.0 || t.samples_s[r] < (1 + 11 * (factor - 1)) * wall)
        EXPECT_GE(t.cpu_samples_s[r], kClockSlack * factor * cpu) << "repetition " << r;
      // 10% and 0.2 ms for the sleep's system call, the clocks' reads and the timer.
      EXPECT_LE(t.cpu_samples_s[r], 1.1 * factor * cpu + 2e-4) << "repetition " << r;
    }
    first += 8;
  }
  opt.injected_slowdown = 0.5;
  EXPECT_THROW(hr::time_region(*dev, region, opt), hr::InvalidArgument);
}

// ---- Check power ----------------------------------------------------------------------

// A property group GA-1 cuda fp32 mlp: a check, and controls caught with these powers
// (gross first, then subtle); a NaN power is a control that was not caught.
hr::Results with_controls(std::vector<double> powers) {
  auto r = with_point(0.1, 0.01, 1000);
  auto tag = [](hr::Measurement m) {
    m.backend = "cuda", m.dtype = "fp32", m.model = "mlp";
    return m;
  };
  r.measurements = {tag(hr::make_check("GA-1", "accumulated gradient", 3e-7, 1e-5))};
  for (size_t i = 0; i < powers.size(); ++i) {
    const double err = std::isnan(powers[i]) ? 0.5e-5 : powers[i] * 1e-5;
    r.measurements.push_back(tag(i == 0 ? hr::make_negative_control("GA-1", "no division by K", err, 1e-5)
                                        : hr::make_subtle_control("GA-1", "divide by K+1", err, 1e-5)));
  }
  hr::compute_totals(r);
  return r;
}

TEST(ReportCompare, CheckPowerIsTheSmallestCaughtControlAndMayNotBeLost) {
  const auto base = with_controls({4000, 3.0});  // power 3: the subtle control
  const auto same = hr::compare_results(base, with_controls({3500, 4.5}));
  ASSERT_NE(row(same, "power"), nullptr);
  EXPECT_EQ(row(same, "power")->verdict, "same");
  EXPECT_DOUBLE_EQ(row(same, "power")->baseline, 3.0);
  EXPECT_DOUBLE_EQ(row(same, "power")->current, 4.5);
  EXPECT_TRUE(same.fit());
  // The subtle control gone: power 4000, more than twice 3: the check only sees
  // gross errors now.
  // (The subtle control itself is then a check of the baseline missing from the run:
  // a failure of its own.)
  const auto grew = hr::compare_results(base, with_controls({4000}));
  EXPECT_EQ(row(grew, "power")->verdict, "regression");
  EXPECT_FALSE(grew.fit());
  ASSERT_EQ(grew.failures.size(), 2u);
  EXPECT_NE(grew.failures[0].find("missing from this run"), std::string::npos) << grew.failures[0];
  EXPECT_NE(grew.failures[1].find("GA-1 cuda fp32 mlp"), std::string::npos) << grew.failures[1];
  EXPECT_NE(grew.failures[1].find("only sees errors"), std::string::npos) << grew.failures[1];
  // Just over twice: a regression; just under: the same.
  EXPECT_EQ(row(hr::compare_results(base, with_controls({4000, 6.3})), "power")->verdict, "regression");
  EXPECT_EQ(row(hr::compare_results(base, with_controls({4000, 5.7})), "power")->verdict, "same");
  // No control left with a power (none run, or not caught): lost.
  const auto lost = hr::compare_results(base, with_controls({}));
  EXPECT_EQ(row(lost, "power")->verdict, "regression");
  EXPECT_NE(row(lost, "power")->note.find("power lost"), std::string::npos);
  EXPECT_FALSE(lost.fit());
  EXPECT_EQ(row(hr::compare_results(base, with_controls({NAN, NAN})), "power")->verdict, "regression");
  // A smaller power is better; a power the baseline lacked is new; neither decides.
  EXPECT_EQ(row(hr::compare_results(base, with_controls({4000, 1.2})), "power")->verdict, "better");
  const auto added = hr::compare_results(with_controls({}), base);
  EXPECT_EQ(row(added, "power")->verdict, "new");
  EXPECT_TRUE(added.fit());
  // The property not in this run at all: its checks are missing (not fit), and no
  // power row is made for it.
  auto absent = base;
  absent.measurements = {hr::make_check("CK-1", "other", 0, 0)};
  const auto c = hr::compare_results(base, absent);
  EXPECT_EQ(row(c, "power"), nullptr);
  EXPECT_FALSE(c.fit());
  EXPECT_EQ(c.checks_missing, 3);
  // The text table prints it like the other rows.
  const std::string text = hr::format_comparison_text(base, with_controls({4000}), grew);
  EXPECT_NE(text.find("GA-1 cuda fp32 mlp"), std::string::npos) << text;
  EXPECT_NE(text.find("check power 3x -> 4000x"), std::string::npos) << text;
}

TEST(ReportCompare, MemoryIsComparedWithinOnePercent) {
  EXPECT_EQ(row(hr::compare_results(with_point(0.1, 0.01, 100000), with_point(0.1, 0.01, 100500)), "peak bytes")->verdict,
            "same");
  const auto c = hr::compare_results(with_point(0.1, 0.01, 100000), with_point(0.1, 0.01, 102000));
  EXPECT_EQ(row(c, "peak bytes")->verdict, "regression");
  EXPECT_FALSE(c.fit());
  EXPECT_EQ(row(hr::compare_results(with_point(0.1, 0.01, 100000), with_point(0.1, 0.01, 90000)), "peak bytes")->verdict,
            "better");
}

TEST(ReportCompare, AFailedConformanceMeasurementIsNotFit) {
  auto cur = with_point(0.1, 0.01, 1000);
  cur.measurements.push_back(hr::make_check("CK-1", "bitwise", 3, 0));
  hr::compute_totals(cur);
  const auto c = hr::compare_results(with_point(0.1, 0.01, 1000), cur);
  EXPECT_FALSE(c.fit());
  EXPECT_EQ(c.conformance_failed, 1);
  ASSERT_EQ(c.failures.size(), 1u);
  EXPECT_NE(c.failures[0].find("CK-1"), std::string::npos);
}

TEST(ReportCompare, PointsThatRanBeforeButNotNowAreRegressions) {
  auto cur = with_point(0.1, 0.01, 1000);
  cur.sweep_points[0].status = "out_of_memory";
  cur.sweep_points[0].reason = "budget";
  const auto c = hr::compare_results(with_point(0.1, 0.01, 1000), cur);
  EXPECT_FALSE(c.fit());
  EXPECT_EQ(row(c, "status")->verdict, "regression");
}

TEST(ReportCompare, MissingPointsAreNotFitAndAnotherDeviceIsFlagged) {
  auto base = with_point(0.1, 0.01, 1000);
  base.sweep_points.push_back(base.sweep_points[0]);
  base.sweep_points[1].config["micro_batch"] = 8;  // in the baseline only
  auto cur = with_point(0.1, 0.01, 1000);
  cur.device["name"] = "another gpu";
  cur.device["driver_version"] = 12040;
  const auto c = hr::compare_results(base, cur);
  EXPECT_FALSE(c.fit());
  EXPECT_FALSE(c.same_device);
  EXPECT_EQ(c.missing, 1);
  EXPECT_EQ(c.matched_points, 1);
  std::string all;
  for (const auto& w : c.warnings) all += w + "\n";
  EXPECT_NE(all.find("another device"), std::string::npos) << all;
  EXPECT_NE(all.find("driver_version"), std::string::npos) << all;
  ASSERT_EQ(c.failures.size(), 1u);
  EXPECT_NE(c.failures[0].find("1 sweep point of the baseline is missing from this run"), std::string::npos)
      << c.failures[0];
  // The device alone does not decide: the same points on another device are fit.
  cur.sweep_points.push_back(base.sweep_points[1]);
  EXPECT_TRUE(hr::compare_results(base, cur).fit());
}

TEST(ReportCompare, ARunThatMatchesNothingIsNotFit) {
  // E.g. a CUDA baseline against a CPU run: nothing compared must not read as a pass.
  auto cur = with_point(0.1, 0.01, 1000);
  cur.sweep_points[0].backend = "cpu";
  const auto c = hr::compare_results(with_point(0.1, 0.01, 1000), cur);
  EXPECT_FALSE(c.fit());
  EXPECT_EQ(c.matched_points, 0);
  ASSERT_FALSE(c.failures.empty());
  EXPECT_NE(c.failures.back().find("nothing compared"), std::string::npos);
  auto none = with_point(0.1, 0.01, 1000);
  none.measurements.clear();
  EXPECT_FALSE(hr::compare_results(with_point(0.1, 0.01, 1000), none).fit());
}

TEST(ReportCompare, FixturePairsGiveTheirVerdicts) {
  const auto cur = hr::load_results(fixture("results.json"));
  const auto ok = hr::compare_results(hr::load_results(fixture("baseline_ok.json")), cur);
  EXPECT_TRUE(ok.fit()) << ok.failures.size();
  EXPECT_GT(ok.matched_points, 50);
  EXPECT_EQ(ok.regressions, 0);
  EXPECT_TRUE(ok.same_device);
  const auto bad = hr::compare_results(hr::load_results(fixture("baseline_faster.json")), cur);
  EXPECT_FALSE(bad.fit());
  EXPECT_EQ(bad.regressions, 8);  // six step times, the total peak and activations at micro-batch 8
  EXPECT_FALSE(bad.same_device);
  const std::string text = hr::format_comparison_text(hr::load_results(fixture("baseline_faster.json")), cur, bad);
  EXPECT_NE(text.find("NOT FIT"), std::string::npos);
  EXPECT_NE(text.find("micro_batch=8"), std::string::npos);
  // A console of 120 columns holds every line; the report has the rest.
  std::istringstream lines(text);
  size_t longest = 0;
  for (std::string line; std::getline(lines, line);) longest = std::max(longest, line.size());
  EXPECT_LE(longest, 120u) << text;
  EXPECT_NE(text.find("slower by 42.9%"), std::string::npos) << text;  // the note kept, on its own line
}

TEST(ReportCommands, CompareExitCodes) {
  std::ostringstream out, err;
  EXPECT_EQ(hr::command_compare(fixture("baseline_ok.json"), fixture("results.json"), "", out, err), 0) << err.str();
  EXPECT_NE(out.str().find("FIT"), std::string::npos);
  EXPECT_EQ(hr::command_compare(fixture("baseline_faster.json"), fixture("results.json"), "", out, err), 1);
  std::ostringstream err2;
  EXPECT_EQ(hr::command_compare(fixture("baseline_schema2.json"), fixture("results.json"), "", out, err2), 2);
  EXPECT_NE(err2.str().find("headroom.results/1"), std::string::npos) << err2.str();
  EXPECT_EQ(hr::command_compare("/nonexistent.json", fixture("results.json"), "", out, err), 2);
}

TEST(ReportCommands, ValidateExitCodesAndReport) {
  const fs::path html = fs::temp_directory_path() / ("headroom_validate_" + std::to_string(::getpid()) + ".html");
  std::ostringstream out, err;
  hr::ValidateCommand v;
  v.baseline = fixture("baseline_ok.json");
  v.results = fixture("results.json");
  v.html = html.string();
  EXPECT_EQ(hr::command_validate(v, out, err), 0) << err.str();
  ASSERT_TRUE(fs::exists(html));
  v.baseline = fixture("baseline_faster.json");
  EXPECT_EQ(hr::command_validate(v, out, err), 1);
  v.baseline = fixture("baseline_schema2.json");
  std::ostringstream err2;
  EXPECT_EQ(hr::command_validate(v, out, err2), 2);
  EXPECT_NE(err2.str().find("not supported"), std::string::npos) << err2.str();
  fs::remove(html);
}

TEST(ReportCommands, RunWritesResultsAndReportOnTheCpu) {
  const fs::path dir = fs::temp_directory_path() / ("headroom_run_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  hr::RunCommand c;
  c.backend = "cpu";
  c.only = "^OPS-3$";
  c.out_dir = dir.string();
  std::ostringstream out, err;
  EXPECT_EQ(hr::command_run(c, out, err), 0) << err.str();
  ASSERT_TRUE(fs::exists(dir / "results.json"));
  ASSERT_TRUE(fs::exists(dir / "index.html"));
  const auto r = hr::load_results((dir / "results.json").string());
  EXPECT_EQ(r.backend, "cpu");
  EXPECT_GE(r.measurements.size(), 1u);
  EXPECT_EQ(r.totals.failed, 0);
  EXPECT_NE(out.str().find("results.json"), std::string::npos);
  EXPECT_NE(err.str().find("[1/1]"), std::string::npos) << err.str();
  // Validating a run against itself is fit.
  hr::ValidateCommand v;
  v.baseline = (dir / "results.json").string();
  v.results = v.baseline;
  EXPECT_EQ(hr::command_validate(v, out, err), 0);
  fs::remove_all(dir);
}

TEST(ReportCommands, DumpWritesOneStepOnTheCpu) {
  const fs::path dir = fs::temp_directory_path() / ("headroom_dump_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  hr::DumpCommand d;
  d.model = "mlp";
  d.out_dir = dir.string();
  std::ostringstream out, err;
  EXPECT_EQ(hr::command_dump(d, out, err), 0) << err.str();
  EXPECT_TRUE(fs::exists(dir / "gradients.safetensors"));
  EXPECT_TRUE(fs::exists(dir / "conventions.json"));
  EXPECT_NE(out.str().find("dumped one mlp forward + backward"), std::string::npos) << out.str();
  fs::remove_all(dir);
  // A configuration the step refuses is bad input, and nothing is created.
  d.micro_batch = 3;
  std::ostringstream err2;
  EXPECT_EQ(hr::command_dump(d, out, err2), 2);
  EXPECT_NE(err2.str().find("micro_batch"), std::string::npos) << err2.str();
  EXPECT_FALSE(fs::exists(dir));
  d.micro_batch = 0;
  d.config_file = "/nonexistent/step.json";
  EXPECT_EQ(hr::command_dump(d, out, err), 2);
}

TEST(ReportCommands, BadInputIsExitTwo) {
  std::ostringstream out, err;
  hr::RunCommand c;
  c.backend = "cpu";
  c.out_dir = (fs::temp_directory_path() / "headroom_never").string();
  c.only = "(";
  EXPECT_EQ(hr::command_run(c, out, err), 2);
  c.only = "";
  c.preset = "medium";
  EXPECT_EQ(hr::command_run(c, out, err), 2);
  c.preset = "quick";
  c.backend = "tpu";
  EXPECT_EQ(hr::command_run(c, out, err), 2);
  EXPECT_FALSE(fs::exists(c.out_dir));
}

}  // namespace
