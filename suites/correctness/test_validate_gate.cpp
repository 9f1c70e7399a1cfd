// `validate` as a gate (docs/catalogue.md VALIDATE): FIT only when every check and
// sweep point of the baseline is in the run, matched by a key that does not move
// with the seed, and holds under the baseline's bound (never the judged file's);
// a run that measured nothing or ended in error is not a pass; impossible numbers
// are bad input; another seed, a busy host and a narrower selection are said as
// such; JUnit and the report say what kind of run it was. Each case fails on the
// behaviour before the rule.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <set>
#include <sstream>
#include <string>

#include "harness/check.hpp"
#include "harness/dist/launch.hpp"
#include "harness/cli/commands.hpp"
#include "harness/results/compare.hpp"
#include "harness/results/junit.hpp"
#include "harness/results/results.hpp"
#include "harness/registry.hpp"
#include "harness/results/runner.hpp"
#include "kernels/attention/attention.hpp"
#include "harness/timing.hpp"
#include "reports/report.hpp"
#include "suites/common/test_support.hpp"

namespace {

namespace fs = std::filesystem;

using hr::test::TempDir;

using hr::test::ScopedEnv;

hr::Measurement tagged(hr::Measurement m, const char* dtype = "fp32") {
  m.backend = "cpu";
  m.dtype = dtype;
  m.model = "mlp";
  m.check = hr::default_check_key(m);
  return m;
}

hr::SweepPoint timed_point(const char* sweep, int mb, double median_s, size_t peak) {
  hr::SweepPoint p;
  p.sweep = sweep;
  p.backend = "cpu";
  p.dtype = "fp32";
  p.model = "mlp";
  p.config = {{"micro_batch", mb}};
  std::vector<double> samples;
  for (int i = 0; i < 12; ++i) samples.push_back(median_s * (1.0 + 0.002 * (i % 5 - 2)));
  p.time = hr::summarize_times(samples);
  p.memory.peak_bytes[static_cast<int>(hr::Consumer::activations)] = peak;
  p.memory.total_peak_bytes = peak;
  return p;
}

// A baseline of the example: PK-3, Q8-4 and MP-5 (a check and a control
// each), and one timed point.
hr::Results baseline() {
  hr::Results r;
  r.run_time_utc = "2026-12-01T00:00:00Z";
  r.preset = "quick";
  r.backend = "cpu";
  r.seed = 1;
  r.device = {{"backend", "cpu"}, {"name", "test cpu"}};
  for (const char* id : {"PK-3", "Q8-4", "MP-5"}) {
    r.measurements.push_back(tagged(hr::make_check(id, "the check", 1e-6, 1e-5)));
    r.measurements.push_back(tagged(hr::make_subtle_control(id, "a subtle fault", 3e-4, 1e-5)));
  }
  r.sweep_points.push_back(timed_point("BM-MB", 4, 0.1, 1000));
  hr::compute_totals(r);
  return r;
}

bool has(const std::vector<std::string>& lines, const std::string& what) {
  for (const auto& l : lines)
    if (l.find(what) != std::string::npos) return true;
  return false;
}

std::string joined(const std::vector<std::string>& lines) {
  std::string s;
  for (const auto& l : lines) s += l + "\n";
  return s;
}

// ---- Missing checks ---------------------------------------------------------------------

TEST(ValidateGate, ACheckOfTheBaselineMissingFromTheRunIsNotFit) {
  const hr::Results base = baseline();
  hr::Results cur = base;
  cur.measurements.resize(2);  // PK-3 only
  hr::compute_totals(cur);
  const hr::Comparison c = hr::compare_results(base, cur);
  EXPECT_FALSE(c.fit());
  EXPECT_EQ(c.checks_missing, 4);
  EXPECT_EQ(c.checks_matched, 2);
  EXPECT_TRUE(has(c.failures, "4 conformance measurements of the baseline are missing")) << joined(c.failures);
  // The same run under another selection is partial, never fit.
  cur.skip = "^(MP-5|Q8-4)$";
  const hr::Comparison p = hr::compare_results(base, cur);
  EXPECT_FALSE(p.fit());
  EXPECT_TRUE(p.partial);
  EXPECT_NE(hr::format_comparison_text(base, cur, p).find("verdict: PARTIAL"), std::string::npos);
  // Complete: fit.
  EXPECT_TRUE(hr::compare_results(base, base).fit()) << joined(hr::compare_results(base, base).failures);
}

TEST(ValidateGate, ACheckSkippedHereIsMissingUnlessTheBaselineSkippedItForTheSameReason) {
  hr::Results base = baseline();
  hr::Results cur = base;
  cur.measurements.resize(4);  // no MP-5
  cur.timings.push_back(hr::SpecTiming{"property", "MP-5", "t", 0, 0, 0, "", "mpirun not found"});
  hr::compute_totals(cur);
  const hr::Comparison c = hr::compare_results(base, cur);
  EXPECT_FALSE(c.fit());
  EXPECT_TRUE(has(c.failures, "skipped in this run: mpirun not found")) << joined(c.failures);
  // Both skipped it for the same reason: nothing of it in either, no difference.
  base.measurements.resize(4);
  base.timings = cur.timings;
  hr::compute_totals(base);
  EXPECT_TRUE(hr::compare_results(base, cur).fit());
}

TEST(ValidateGate, MissingSweepPointsAreNotFitButOnesTheBaselineSkippedAreNot) {
  hr::Results base = baseline();
  base.sweep_points.push_back(timed_point("BM-MB", 8, 0.1, 1000));
  hr::compute_totals(base);
  hr::Results cur = baseline();
  const hr::Comparison c = hr::compare_results(base, cur);
  EXPECT_FALSE(c.fit());
  EXPECT_EQ(c.missing, 1);
  EXPECT_TRUE(has(c.failures, "1 sweep point of the baseline is missing")) << joined(c.failures);
  base.sweep_points.back().status = "skipped";
  base.sweep_points.back().time.reset();
  base.sweep_points.back().reason = "no mpirun";
  EXPECT_TRUE(hr::compare_results(base, cur).fit());
}

// ---- Whose bound ------------------------------------------------------------------------

TEST(ValidateGate, TheJudgedFilesToleranceIsNeverUsed) {
  const hr::Results base = baseline();  // PK-3's bound: 1e-5
  for (const double loosened : {1e300, 1e-3, 1e-4}) {
    hr::Results cur = base;
    cur.measurements[0].error = 5e-5;  // 5x the baseline's bound
    cur.measurements[0].tolerance = loosened;
    cur.measurements[0].passed = true;  // consistent with the file's own (loosened) bound
    const hr::Comparison c = hr::compare_results(base, cur);
    EXPECT_FALSE(c.fit()) << loosened;
    EXPECT_TRUE(has(c.failures, "exceeds the bound 1e-05")) << joined(c.failures);
    EXPECT_TRUE(has(c.failures, "the baseline's bound decides")) << joined(c.failures);
  }
  // A control that looks caught under a bound the file lowered is not caught.
  hr::Results cur = base;
  cur.measurements[1].error = 5e-6;
  cur.measurements[1].tolerance = 1e-7;
  EXPECT_FALSE(hr::compare_results(base, cur).fit());
  // A run of this build: the tighter of the two bounds.
  hr::CompareOptions live;
  live.run_is_this_build = true;
  hr::Results tighter = base;
  tighter.measurements[0].error = 5e-6;      // under the baseline's 1e-5
  tighter.measurements[0].tolerance = 2e-6;  // this build's table is tighter
  EXPECT_FALSE(hr::compare_results(base, tighter, live).fit());
  EXPECT_TRUE(hr::compare_results(base, tighter).fit());  // a file: the baseline's bound only
}

TEST(ValidateGate, AToleranceNoCheckHasIsBadInput) {
  nlohmann::json j = hr::results_to_json(baseline());
  for (const char* bad : {"inf", "nan"}) {
    nlohmann::json k = j;
    k["measurements"][0]["tolerance"] = bad;
    k["measurements"][0]["passed"] = false;
    EXPECT_THROW(hr::results_from_json(k), hr::InvalidArgument) << bad;
  }
  nlohmann::json k = j;
  k["measurements"][0]["tolerance"] = -1;
  k["measurements"][0]["passed"] = false;
  EXPECT_THROW(hr::results_from_json(k), hr::InvalidArgument);
}

// ---- Impossible numbers -----------------------------------------------------------------

TEST(ValidateGate, ImpossibleTimesPeaksAndCountsAreBadInput) {
  const nlohmann::json j = hr::results_to_json(baseline());
  EXPECT_NO_THROW(hr::results_from_json(j));
  auto refused = [&](const std::function<void(nlohmann::json&)>& edit, const std::string& says) {
    nlohmann::json k = j;
    edit(k);
    try {
      hr::results_from_json(k);
    } catch (const hr::InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
      return;
    }
    ADD_FAILURE() << "accepted: " << says;
  };
  auto& t = j["sweep_points"][0];
  ASSERT_TRUE(t.contains("time"));
  for (const nlohmann::json v : {nlohmann::json(0), nlohmann::json(-0.1), nlohmann::json("nan"), nlohmann::json("inf")})
    refused([&](nlohmann::json& k) { k["sweep_points"][0]["time"]["median_s"] = v; }, "median_s");
  refused([](nlohmann::json& k) { k["sweep_points"][0]["time"]["samples_s"][3] = 0; }, "a sample");
  refused([](nlohmann::json& k) { k["sweep_points"][0]["time"]["reps"] = 99; }, "reps is 99");
  refused([](nlohmann::json& k) { k["sweep_points"][0]["memory"]["peak_bytes"]["activations"] = -1000; },
          "byte count");
  refused([](nlohmann::json& k) { k["sweep_points"][0]["memory"]["total_peak_bytes"] = 1.5; }, "byte count");
  refused([](nlohmann::json& k) { k["sweep_points"][0]["status"] = "fine"; }, "status 'fine'");
  refused([](nlohmann::json& k) { k["totals"]["negative_controls_caught"] = 2; }, "totals.negative_controls_caught");
  refused([](nlohmann::json& k) { k["totals"]["sweep_points_error"] = 1; }, "totals.sweep_points_error");
}

TEST(ValidateGate, APointThatRecordsNothingIsNoImprovement) {
  const hr::Results base = baseline();
  hr::Results zero = base;
  zero.sweep_points[0].memory = hr::MemorySnapshot{};
  const hr::Comparison c = hr::compare_results(base, zero);
  EXPECT_FALSE(c.fit());
  EXPECT_EQ(c.improvements, 0);
  EXPECT_TRUE(has(c.failures, "none recorded in this run")) << joined(c.failures);
  hr::Results untimed = base;
  untimed.sweep_points[0].time.reset();
  const hr::Comparison u = hr::compare_results(base, untimed);
  EXPECT_FALSE(u.fit());
  EXPECT_TRUE(has(u.failures, "not timed in this run")) << joined(u.failures);
}

TEST(ValidateGate, APointInErrorIsNotFitEvenWhenTheBaselineHadTheSame) {
  hr::Results base = baseline();
  base.sweep_points[0].status = "error";
  base.sweep_points[0].time.reset();
  base.sweep_points[0].reason = "mpirun failed";
  hr::compute_totals(base);
  const hr::Comparison c = hr::compare_results(base, base);
  EXPECT_FALSE(c.fit());
  EXPECT_TRUE(has(c.failures, "ended in error: mpirun failed")) << joined(c.failures);
}

// ---- Seeds and hosts --------------------------------------------------------------------

TEST(ValidateGate, AnotherSeedIsSaidFirstAndPowerIsNotJudged) {
  const hr::Results base = baseline();
  hr::Results cur = base;
  cur.seed = 2;
  cur.measurements[1].error = 9e-4;  // power 30 -> 90: judged between equal seeds
  cur.measurements[1].power = 90;
  const hr::Comparison c = hr::compare_results(base, cur);
  EXPECT_TRUE(c.seeds_differ);
  EXPECT_TRUE(c.fit()) << joined(c.failures);
  const std::string text = hr::format_comparison_text(base, cur, c);
  EXPECT_EQ(text.rfind("seeds differ: baseline seed 1, this run seed 2", 0), 0u) << text;
  cur.seed = 1;
  EXPECT_FALSE(hr::compare_results(base, cur).fit());
}

TEST(ValidateGate, ABusyHostMakesSmallTimeChangesNoisyButCatchesATwofoldSlowdown) {
  const hr::Results base = baseline();
  hr::Results cur = base;
  cur.sweep_points[0] = timed_point("BM-MB", 4, 0.16, 1000);  // +60%, as seen under two busy loops
  EXPECT_FALSE(hr::compare_results(base, cur).fit());         // a quiet host: a regression
  hr::HostLoad busy = hr::test::busy_host_load();
  ASSERT_TRUE(busy.busy());
  cur.host = busy;
  // The run validate measured itself: its host's load is its own record.
  hr::CompareOptions measured_here;
  measured_here.run_is_this_build = true;
  const hr::Comparison c = hr::compare_results(base, cur, measured_here);
  EXPECT_TRUE(c.fit()) << joined(c.failures);
  EXPECT_TRUE(c.host_busy);
  EXPECT_EQ(c.noisy, 1);
  // A judged file's own word that its host was busy is no reason to judge it more
  // loosely: a regression, with a warning that says why the claim was not taken.
  const hr::Comparison file = hr::compare_results(base, cur);
  EXPECT_FALSE(file.fit());
  EXPECT_FALSE(file.host_busy);
  EXPECT_TRUE(std::any_of(file.warnings.begin(), file.warnings.end(), [](const std::string& w) {
    return w.find("says its host was busy") != std::string::npos;
  }));
  // The baseline's record is trusted: a busy baseline host loosens the bound too,
  // also where the baseline is judged against itself (one object for both).
  hr::Results busy_base = base;
  busy_base.host = busy;
  hr::Results quiet_cur = cur;
  quiet_cur.host.reset();
  EXPECT_TRUE(hr::compare_results(busy_base, quiet_cur).fit());
  const hr::Comparison itself = hr::compare_results(busy_base, busy_base);
  EXPECT_TRUE(itself.host_busy);
  EXPECT_EQ(std::count_if(itself.warnings.begin(), itself.warnings.end(),
                          [](const std::string& w) { return w.find("says its host was busy") != std::string::npos; }),
            1);
  cur.sweep_points[0] = timed_point("BM-MB", 4, 0.2, 1000);  // 2x
  const hr::Comparison d = hr::compare_results(base, cur, measured_here);
  EXPECT_FALSE(d.fit());
  EXPECT_EQ(d.regressions, 1);
  // Idle: 1.5 of 2 CPUs is busy, 0.1 is not.
  busy.other_busy_cpus = 0.1;
  EXPECT_FALSE(busy.busy());
}

TEST(ValidateGate, HostLoadIsRecordedAndRoundTrips) {
  const hr::HostSample s = hr::sample_host();
  const hr::HostLoad h = hr::host_load_since(s);
  EXPECT_GT(h.cpus, 0);
  hr::Results r = baseline();
  r.host = h;
  const hr::Results back = hr::results_from_json(hr::results_to_json(r));
  ASSERT_TRUE(back.host.has_value());
  EXPECT_EQ(back.host->cpus, h.cpus);
  EXPECT_EQ(back.host->busy(), h.busy());
}

// ---- Check keys -------------------------------------------------------------------------

// The properties whose keys carried a seed's numbers (a drawn tensor, bit or word, a
// fault sized from the seed's loss, the rows a packing needed): the same keys at two
// seeds.
TEST(ValidateGate, CheckKeysDoNotMoveWithTheSeed) {
  hr::RunOptions opt;
  opt.only = "^(OPS-1|OPS-3|LR-2|PK-1|BN-2)$";
  std::set<std::string> keys[2];
  std::unique_ptr<hr::Device> dev = hr::make_device("cpu");
  for (int i = 0; i < 2; ++i) {
    opt.seed = i == 0 ? 1 : 2;
    const hr::Results r = hr::run_suite(*dev, opt, nullptr);
    ASSERT_GT(r.measurements.size(), 10u);
    for (const auto& m : r.measurements) keys[i].insert(m.check);
  }
  EXPECT_EQ(keys[0], keys[1]);
}

// ---- The commands -----------------------------------------------------------------------

TEST(ValidateGate, ASelectionOfNothingIsBadInputAndARunOfNothingFails) {
  TempDir dir;
  hr::RunCommand run;
  run.backend = "cpu";
  run.out_dir = (dir.path / "none").string();
  run.only = "^NO-SUCH-ID$";
  std::ostringstream out, err;
  EXPECT_EQ(hr::command_run(run, out, err), 2);
  EXPECT_NE(err.str().find("matches no property or sweep"), std::string::npos) << err.str();
  EXPECT_FALSE(fs::exists(run.out_dir));
  run.only = ".";
  run.skip = ".";
  EXPECT_EQ(hr::command_run(run, out, err), 2);
  // Only what cannot run here: nothing measured, exit 1.
  const ScopedEnv no_mpirun("HEADROOM_MPIRUN", "/nonexistent/mpirun");
  run.only = "^(DP-1|MEM-3)$";
  run.skip.clear();
  std::ostringstream out2, err2;
  EXPECT_EQ(hr::command_run(run, out2, err2), 1) << out2.str() << err2.str();
  EXPECT_NE(out2.str().find("nothing was measured"), std::string::npos) << out2.str();
  EXPECT_NE(out2.str().find("2 skipped here"), std::string::npos) << out2.str();
}

TEST(ValidateGate, ASweepPointInErrorFailsTheRunAndIsCounted) {
  const ScopedEnv broken("HEADROOM_MPIRUN", "/bin/false");
  if (!hr::dist::dp_unavailable_reason().empty()) GTEST_SKIP() << hr::dist::dp_unavailable_reason();
  TempDir dir;
  hr::RunCommand run;
  run.backend = "cpu";
  run.out_dir = (dir.path / "dp").string();
  run.only = "^OPS-3$|^BM-DP$";
  run.dp_ranks = {2};
  run.junit = (dir.path / "junit.xml").string();
  std::ostringstream out, err;
  EXPECT_EQ(hr::command_run(run, out, err), 1) << out.str() << err.str();
  EXPECT_NE(out.str().find("1 sweep point in error"), std::string::npos) << out.str();
  EXPECT_NE(out.str().find("with errors run"), std::string::npos) << out.str();
  std::ifstream in(run.junit);
  std::stringstream xml;
  xml << in.rdbuf();
  EXPECT_NE(xml.str().find("<failure message=\"ended in error"), std::string::npos) << xml.str();
  EXPECT_NE(xml.str().find("classname=\"OPS-3\""), std::string::npos);
}

// A baseline file of a small run, written here.
std::string write_baseline(const TempDir& dir, const std::function<void(hr::Results&)>& edit = {}) {
  hr::RunCommand run;
  run.backend = "cpu";
  run.only = "^(PK-3|Q8-4)$";
  run.seed = 7;
  run.out_dir = (dir.path / "base").string();
  std::ostringstream out, err;
  EXPECT_EQ(hr::command_run(run, out, err), 0) << err.str();
  const std::string path = (dir.path / "base" / "results.json").string();
  if (edit) {
    hr::Results r = hr::load_results(path);
    edit(r);
    hr::save_results(r, path);
  }
  return path;
}

TEST(ValidateGate, ValidateAdoptsTheBaselinesSeedAndSelection) {
  TempDir dir;
  hr::ValidateCommand v;
  v.baseline = write_baseline(dir);
  v.run.out_dir = (dir.path / "now").string();
  v.run.junit = (dir.path / "gate.xml").string();
  std::ostringstream out, err;
  EXPECT_EQ(hr::command_validate(v, out, err), 0) << out.str() << err.str();
  const hr::Results now = hr::load_results((dir.path / "now" / "results.json").string());
  EXPECT_EQ(now.seed, 7u);
  EXPECT_EQ(now.only, "^(PK-3|Q8-4)$");
  EXPECT_NE(out.str().find("verdict: FIT"), std::string::npos) << out.str();
  std::ifstream in(v.run.junit);
  std::stringstream xml;
  xml << in.rdbuf();
  EXPECT_NE(xml.str().find("failures=\"0\""), std::string::npos) << xml.str();
  EXPECT_NE(xml.str().find("classname=\"Q8-4\""), std::string::npos) << xml.str();
  // A narrower selection given: partial, exit 1, and JUnit names the missing checks.
  v.given.only = true;
  v.run.only = "^PK-3$";
  std::ostringstream out2, err2;
  EXPECT_EQ(hr::command_validate(v, out2, err2), 1) << out2.str();
  EXPECT_NE(out2.str().find("verdict: PARTIAL"), std::string::npos) << out2.str();
  std::ifstream in2(v.run.junit);
  std::stringstream xml2;
  xml2 << in2.rdbuf();
  EXPECT_NE(xml2.str().find("missing from this run"), std::string::npos) << xml2.str();
}

TEST(ValidateGate, ABaselineThisMachineCannotMatchIsRefusedBeforeAnythingRuns) {
  TempDir dir;
  hr::ValidateCommand v;
  v.run.out_dir = (dir.path / "now").string();
  // Another device model.
  v.baseline = write_baseline(dir, [](hr::Results& r) { r.device["name"] = "another CPU"; });
  std::ostringstream out, err;
  EXPECT_EQ(hr::command_validate(v, out, err), 2);
  EXPECT_NE(err.str().find("--any-device"), std::string::npos) << err.str();
  EXPECT_FALSE(fs::exists(dir.path / "now" / "results.json"));
  v.any_device = true;
  std::ostringstream out2, err2;
  EXPECT_EQ(hr::command_validate(v, out2, err2), 0) << out2.str() << err2.str();
  // A GPU baseline on a machine without one; a preset given that is not the baseline's.
  TempDir other;
  hr::ValidateCommand g;
  g.run.out_dir = (other.path / "now").string();
  g.baseline = write_baseline(other, [](hr::Results& r) {
    r.backend = "cuda";
    r.device["backend"] = "cuda";
  });
  std::string why;
  if (!hr::cuda_device_available(&why)) {
    std::ostringstream o, e;
    EXPECT_EQ(hr::command_validate(g, o, e), 2);
    EXPECT_NE(e.str().find("no usable GPU"), std::string::npos) << e.str();
    EXPECT_FALSE(fs::exists(other.path / "now"));
  }
  hr::ValidateCommand p = v;
  p.given.preset = true;
  p.run.preset = "full";
  std::ostringstream o, e;
  EXPECT_EQ(hr::command_validate(p, o, e), 2);
  EXPECT_NE(e.str().find("--preset full"), std::string::npos) << e.str();
}

// A baseline that ran on some GPU attention kernels is validated on the same ones:
// HEADROOM_ATTENTION_KERNEL naming others is refused before anything runs, and
// without it the baseline's become the setting.
TEST(ValidateGate, ValidateRunsTheBaselinesAttentionKernels) {
  const hr::ops::ScopedGpuAttentionKernel restored(hr::ops::gpu_attention_kernel());
  TempDir dir;
  hr::ValidateCommand v;
  v.run.out_dir = (dir.path / "now").string();
  v.baseline = write_baseline(dir, [](hr::Results& r) { r.attention_kernel = "tensor_core"; });
  {
    const ScopedEnv other("HEADROOM_ATTENTION_KERNEL", "scalar");
    std::ostringstream out, err;
    EXPECT_EQ(hr::command_validate(v, out, err), 2);
    EXPECT_NE(err.str().find("ran the tensor_core attention kernels"), std::string::npos) << err.str();
    EXPECT_FALSE(fs::exists(dir.path / "now" / "results.json"));
  }
  hr::ops::set_gpu_attention_kernel(hr::ops::GpuAttentionKernel::scalar);
  std::ostringstream out, err;
  EXPECT_EQ(hr::command_validate(v, out, err), 0) << out.str() << err.str();
  EXPECT_EQ(hr::ops::gpu_attention_kernel(), hr::ops::GpuAttentionKernel::tensor_core);
}

// A sweep without a re-measure hook of its own (BM-OPT) is run again before a
// slower point is called a regression: the injected 8x is confirmed there. This
// step moves by 2.5x between two runs on a loaded CI host (a baseline read 0.32 ms,
// a run 0.13 ms a step), and such a host sets a 75% minimum effect: 8x stays past
// it at that spread, where 4x may not (2x once was p=0.011).
TEST(ValidateGate, ASweepWithoutItsOwnHookIsReMeasuredBeforeARegressionIsCalled) {
  TempDir dir;
  hr::RunCommand run;
  run.backend = "cpu";
  run.only = "^BM-OPT$";
  run.out_dir = (dir.path / "base").string();
  std::ostringstream out, err;
  ASSERT_EQ(hr::command_run(run, out, err), 0) << err.str();
  hr::ValidateCommand v;
  v.baseline = (dir.path / "base" / "results.json").string();
  v.run.out_dir = (dir.path / "slow").string();
  const ScopedEnv slow(hr::kInjectSlowdownEnv, "BM-OPT:optimizer=adamw:8");
  std::ostringstream out2, err2;
  EXPECT_EQ(hr::command_validate(v, out2, err2), 1) << out2.str();
  EXPECT_NE(err2.str().find("re-measuring BM-OPT"), std::string::npos) << err2.str();
  EXPECT_NE(out2.str().find("optimizer=adamw"), std::string::npos) << out2.str();
  EXPECT_NE(out2.str().find("confirmed on re-measurement"), std::string::npos) << out2.str();
}

// BM-PK measures one fixed workload (not the run's seed's lengths) and one model's
// bytes: its steps for other batch sizes are models of their own and were counted
// once per size (weights 2-5x one model's, moving with the seed).
TEST(ValidateGate, PackingBenchBytesAreOneModelsAndDoNotMoveWithTheSeed) {
  std::unique_ptr<hr::Device> dev = hr::make_device("cpu");
  const hr::SweepSpec* spec = nullptr;
  for (const auto& s : hr::sweep_registry())
    if (s.id == "BM-PK") spec = &s;
  ASSERT_NE(spec, nullptr);
  std::vector<hr::SweepPoint> pts[2];
  for (int i = 0; i < 2; ++i) {
    hr::RunContext ctx{*dev, hr::Preset::quick, i == 0 ? 1u : 2u, {}};
    pts[i] = spec->run(ctx);
    ASSERT_EQ(pts[i].size(), 3u);
  }
  const size_t weights = pts[0][0].memory.peak(hr::Consumer::weights);
  EXPECT_GT(weights, 0u);
  for (int i = 0; i < 2; ++i)
    for (size_t k = 0; k < 3; ++k) {
      EXPECT_EQ(pts[i][k].memory.peak(hr::Consumer::weights), weights) << pts[i][k].config.dump();
      EXPECT_EQ(pts[i][k].memory.peak(hr::Consumer::gradients), weights) << pts[i][k].config.dump();
      EXPECT_EQ(pts[i][k].config, pts[0][k].config);
      for (hr::Consumer c : hr::kAllConsumers) EXPECT_EQ(pts[i][k].memory.peak(c), pts[0][k].memory.peak(c));
    }
}

// ---- What kind of run ---------------------------------------------------------------------

TEST(ValidateGate, TheReportsFirstScreenSaysWhatKindOfRunItWas) {
  hr::Results r = baseline();
  auto summary = [](const hr::Results& x) {
    const std::string html = hr::report::render_report(x);
    const size_t a = html.find("id=\"summary\"");
    return html.substr(a, html.find("</section>", a) - a);
  };
  EXPECT_NE(summary(r).find(">complete<"), std::string::npos);
  r.incomplete = true;
  r.not_run = {"GA-1"};
  EXPECT_NE(summary(r).find(">interrupted<"), std::string::npos) << summary(r);
  r.incomplete = false;
  r.not_run.clear();
  r.only = "^PK-3$";
  EXPECT_NE(summary(r).find(">partial<"), std::string::npos);
  r.sweep_points[0].status = "error";
  EXPECT_NE(summary(r).find(">with errors<"), std::string::npos);
  EXPECT_EQ(hr::run_kind(hr::Results{}), "empty");
}

}  // namespace
