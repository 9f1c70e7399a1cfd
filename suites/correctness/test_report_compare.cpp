// Baseline comparison and the commands' exit codes: a matching pair is fit (0), a
// regressed pair is not (1), a baseline of another schema is bad input (2); the
// noise-aware time threshold, the memory tolerance, conformance failures, flags;
// and `run` end to end on the CPU.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <sstream>
#include <string>

#include "harness/results/commands.hpp"
#include "harness/results/compare.hpp"
#include "harness/results/results.hpp"

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

TEST(ReportCompare, ANoisyTimingIsFlaggedNotJudged) {
  const auto c = hr::compare_results(with_point(0.100, 0.01, 1000), with_point(0.200, 0.40, 1000));
  EXPECT_EQ(row(c, "step time")->verdict, "noisy");
  EXPECT_TRUE(c.fit());
  EXPECT_EQ(c.noisy, 1);
  EXPECT_FALSE(c.warnings.empty());
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

TEST(ReportCompare, MissingPointsAndAnotherDeviceAreFlaggedButDoNotDecide) {
  auto base = with_point(0.1, 0.01, 1000);
  base.sweep_points.push_back(base.sweep_points[0]);
  base.sweep_points[1].config["micro_batch"] = 8;  // in the baseline only
  auto cur = with_point(0.1, 0.01, 1000);
  cur.device["name"] = "another gpu";
  cur.device["driver_version"] = 12040;
  const auto c = hr::compare_results(base, cur);
  EXPECT_TRUE(c.fit());
  EXPECT_FALSE(c.same_device);
  EXPECT_EQ(c.missing, 1);
  EXPECT_EQ(c.matched_points, 1);
  std::string all;
  for (const auto& w : c.warnings) all += w + "\n";
  EXPECT_NE(all.find("another device"), std::string::npos) << all;
  EXPECT_NE(all.find("driver_version"), std::string::npos) << all;
  EXPECT_NE(all.find("1 sweep point of the baseline is not in this run"), std::string::npos) << all;
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
  EXPECT_NE(out.str().find("dumped one mlp step"), std::string::npos) << out.str();
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
