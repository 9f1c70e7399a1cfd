// results.json: round trip with non-finite numbers, schema refusal, field
// validation, atomic replacement, and the runner's handling of a property or
// sweep that throws (recorded, never aborting the run).
#include <gtest/gtest.h>

#include <chrono>
#include <thread>
#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <set>
#include <string>
#include <vector>

#include "harness/check.hpp"
#include "harness/output.hpp"
#include "harness/results/results.hpp"
#include "harness/results/runner.hpp"
#include "suites/common/test_support.hpp"

namespace {

namespace fs = std::filesystem;

fs::path testdata() { return fs::path(__FILE__).parent_path() / ".." / ".." / "reports" / "testdata"; }

using hr::test::TempDir;

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

hr::Results sample_results() {
  hr::Results r;
  r.run_time_utc = "2025-01-31T12:00:00Z";
  r.duration_s = 1.5;
  r.preset = "quick";
  r.backend = "cpu";
  r.seed = 0xffffffffffffffffull;  // the full uint64 range survives
  r.device = nlohmann::json{{"backend", "cpu"}, {"name", "test cpu"}, {"cores", 2}};
  r.build = hr::build_record();
  hr::Measurement a = hr::make_check("GA-1", "accumulated equals full batch", std::nan(""), 1e-5);
  a.backend = "cpu";
  a.dtype = "fp32";
  a.model = "mlp";
  a.config = {{"micro_batch", 4}};
  a.metric = "rel_l2";
  a.details = {{"ratio", INFINITY}, {"neg", -INFINITY}, {"nested", {{"v", std::nan("")}}}};
  r.measurements.push_back(a);
  hr::Measurement b = hr::make_negative_control("GA-2", "no division is caught", INFINITY, 1e-5);
  b.backend = "cpu";
  r.measurements.push_back(b);
  hr::SweepPoint p;
  p.sweep = "BM-MB";
  p.backend = "cpu";
  p.dtype = "fp32";
  p.model = "mlp";
  p.config = {{"micro_batch", 2}, {"accum_steps", 16}};
  p.time = hr::summarize_times({0.010, 0.011, 0.012, 0.010, 0.013});
  p.memory.peak_bytes = {100, 200, 300, 400, 500};
  p.memory.total_peak_bytes = 1400;
  p.metrics = {{"tokens_per_s", 1234.5}, {"bad", std::nan("")}};
  r.sweep_points.push_back(p);
  hr::SweepPoint q;
  q.sweep = "BM-MB";
  q.status = "out_of_memory";
  q.reason = "budget";
  r.sweep_points.push_back(q);
  hr::compute_totals(r);
  return r;
}

TEST(ReportResults, RoundTripKeepsNonFiniteValuesExplicit) {
  const hr::Results r = sample_results();
  const std::string text = hr::results_to_json(r).dump(2);
  EXPECT_EQ(text.find("null"), std::string::npos) << "non-finite values must not be written as null:\n" << text;
  EXPECT_NE(text.find("\"nan\""), std::string::npos);
  EXPECT_NE(text.find("\"inf\""), std::string::npos);
  EXPECT_NE(text.find("\"-inf\""), std::string::npos);
  EXPECT_NE(text.find("\"schema\": \"headroom.results/1\""), std::string::npos);

  const hr::Results back = hr::results_from_json(nlohmann::json::parse(text));
  ASSERT_EQ(back.measurements.size(), 2u);
  EXPECT_TRUE(std::isnan(back.measurements[0].error));
  EXPECT_FALSE(back.measurements[0].passed);
  EXPECT_TRUE(std::isinf(back.measurements[1].error) && back.measurements[1].error > 0);
  EXPECT_FALSE(back.measurements[1].passed);  // an inf error is not a catch (docs/catalogue.md POWER)
  EXPECT_TRUE(back.measurements[1].negative_control);
  EXPECT_EQ(back.measurements[0].details["ratio"], "inf");
  EXPECT_EQ(back.measurements[0].details["nested"]["v"], "nan");
  EXPECT_EQ(back.seed, 0xffffffffffffffffull);
  EXPECT_EQ(back.device["name"], "test cpu");
  ASSERT_EQ(back.sweep_points.size(), 2u);
  const auto& p = back.sweep_points[0];
  ASSERT_TRUE(p.time.has_value());
  EXPECT_DOUBLE_EQ(p.time->median_s, r.sweep_points[0].time->median_s);
  EXPECT_DOUBLE_EQ(p.time->rel_spread, r.sweep_points[0].time->rel_spread);
  EXPECT_EQ(p.memory.total_peak_bytes, 1400u);
  EXPECT_EQ(p.memory.peak(hr::Consumer::activations), 400u);
  EXPECT_EQ(p.config, r.sweep_points[0].config);
  EXPECT_EQ(back.sweep_points[1].status, "out_of_memory");
  EXPECT_FALSE(back.sweep_points[1].time.has_value());
  // Totals are recounted on load.
  EXPECT_EQ(back.totals.measurements, 2);
  EXPECT_EQ(back.totals.passed, 0);
  EXPECT_EQ(back.totals.negative_controls_caught, 0);
  EXPECT_EQ(back.totals.sweep_points_out_of_memory, 1);
  // A second round trip is a fixed point.
  EXPECT_EQ(hr::results_to_json(back).dump(), hr::results_to_json(hr::results_from_json(hr::results_to_json(back))).dump());
}

TEST(ReportResults, LoadsTheFixture) {
  const hr::Results r = hr::load_results((testdata() / "results.json").string());
  EXPECT_EQ(r.schema, "headroom.results/1");
  EXPECT_GT(r.measurements.size(), 10u);
  EXPECT_GT(r.sweep_points.size(), 50u);
  EXPECT_EQ(r.totals.failed, 0);
  EXPECT_EQ(r.device["name"], "<script>alert(1)</script>&\"'");
}

TEST(ReportResults, RefusesAnotherSchemaVersionWithAClearMessage) {
  try {
    hr::load_results((testdata() / "baseline_schema2.json").string());
    FAIL() << "a headroom.results/2 file was accepted";
  } catch (const hr::InvalidArgument& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("headroom.results/2"), std::string::npos) << what;
    EXPECT_NE(what.find("headroom.results/1"), std::string::npos) << what;
    EXPECT_NE(what.find("baseline_schema2.json"), std::string::npos) << what;
  }
}

TEST(ReportResults, RefusesFilesThatAreNotResults) {
  EXPECT_THROW(hr::results_from_json(nlohmann::json{{"hello", 1}}), hr::InvalidArgument);
  EXPECT_THROW(hr::results_from_json(nlohmann::json{{"schema", "something.else/1"}}), hr::InvalidArgument);
  EXPECT_THROW(hr::results_from_json(nlohmann::json::array()), hr::InvalidArgument);
  EXPECT_THROW(hr::load_results("/nonexistent/results.json"), hr::InvalidArgument);
  TempDir dir;
  const auto bad = dir.path / "bad.json";
  std::ofstream(bad) << "{ not json";
  EXPECT_THROW(hr::load_results(bad.string()), hr::InvalidArgument);
}

TEST(ReportResults, AMissingOrMistypedFieldIsNamed) {
  auto j = hr::results_to_json(sample_results());
  j.erase("measurements");
  try {
    hr::results_from_json(j, "x.json");
    FAIL();
  } catch (const hr::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("measurements"), std::string::npos) << e.what();
  }
  auto k = hr::results_to_json(sample_results());
  k["measurements"][0]["error"] = "lots";
  EXPECT_THROW(hr::results_from_json(k), hr::InvalidArgument);
  auto m = hr::results_to_json(sample_results());
  m["measurements"][0]["passed"] = 1;
  EXPECT_THROW(hr::results_from_json(m), hr::InvalidArgument);
}

TEST(ReportResults, AtomicWriteReplacesWholeFilesAndLeavesNoTemporaries) {
  TempDir dir;
  const fs::path target = dir.path / "results.json";
  hr::write_output(target.string(), "first version\n");
  EXPECT_EQ(slurp(target), "first version\n");
  // A reader holding the old file keeps reading the old contents: the new file
  // replaced it by rename, it was not rewritten in place.
  std::ifstream reader(target, std::ios::binary);
  ASSERT_TRUE(reader.good());
  const std::string big(1 << 20, 'x');
  hr::write_output(target.string(), big);
  std::stringstream old;
  old << reader.rdbuf();
  EXPECT_EQ(old.str(), "first version\n");
  EXPECT_EQ(slurp(target), big);
  int entries = 0;
  for (const auto& e : fs::directory_iterator(dir.path)) {
    ++entries;
    EXPECT_EQ(e.path().filename(), "results.json") << "left behind: " << e.path();
  }
  EXPECT_EQ(entries, 1);
  EXPECT_EQ(fs::status(target).permissions() & fs::perms::others_read, fs::perms::others_read);
}

TEST(ReportResults, AtomicWriteIntoAMissingDirectoryThrows) {
  TempDir dir;
  EXPECT_THROW(hr::write_output((dir.path / "no" / "such" / "dir" / "r.json").string(), "x"), hr::Error);
  EXPECT_TRUE(fs::is_empty(dir.path));
}

TEST(ReportResults, SaveAndLoad) {
  TempDir dir;
  const auto path = (dir.path / "r.json").string();
  hr::save_results(sample_results(), path);
  const auto back = hr::load_results(path);
  EXPECT_EQ(back.measurements.size(), 2u);
  EXPECT_EQ(back.sweep_points.size(), 2u);
}

// --ranks travels with the file (so --resume launches the same rank counts); a file
// without it reads as the default, and a bad count is named.
TEST(ReportResults, RankCountsRoundTripAndAreChecked) {
  hr::Results r = sample_results();
  EXPECT_FALSE(hr::results_to_json(r).contains("dp_ranks"));
  EXPECT_TRUE(hr::results_from_json(hr::results_to_json(r)).dp_ranks.empty());
  r.dp_ranks = {4};
  EXPECT_EQ(hr::results_from_json(hr::results_to_json(r)).dp_ranks, std::vector<int>{4});
  for (const char* bad : {R"("4")", "[1]", "[2.5]", "[\"two\"]"}) {
    auto j = hr::results_to_json(r);
    j["dp_ranks"] = nlohmann::json::parse(bad);
    try {
      hr::results_from_json(j, "x.json");
      ADD_FAILURE() << bad;
    } catch (const hr::InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("dp_ranks"), std::string::npos) << e.what();
    }
  }
}

// A CUDA run's attention kernels travel with the file (validate and --resume run the
// same ones); a CPU run, or a file from before, has none, and an unknown name is
// refused.
TEST(ReportResults, AttentionKernelsRoundTripAndAreChecked) {
  hr::Results r = sample_results();
  EXPECT_FALSE(hr::results_to_json(r).contains("attention_kernel"));
  EXPECT_EQ(hr::results_from_json(hr::results_to_json(r)).attention_kernel, "");
  for (const char* k : {"scalar", "tensor_core", "cudnn"}) {
    r.attention_kernel = k;
    EXPECT_EQ(hr::results_from_json(hr::results_to_json(r)).attention_kernel, k);
  }
  auto j = hr::results_to_json(r);
  j["attention_kernel"] = "flash";
  try {
    hr::results_from_json(j, "x.json");
    ADD_FAILURE() << "an unknown attention kernel was read";
  } catch (const hr::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("attention_kernel"), std::string::npos) << e.what();
  }
}

// The kernels a timed point ran travel with its time; a file from before has none,
// and a count that no run gives (zero, negative, not a number) or a field that is
// not a map is refused, naming it.
TEST(ReportResults, KernelCallsRoundTripAndAreChecked) {
  hr::Results r = sample_results();
  ASSERT_TRUE(r.sweep_points[0].time.has_value());
  EXPECT_FALSE(hr::results_to_json(r)["sweep_points"][0]["time"].contains("kernel_calls"));
  EXPECT_TRUE(hr::results_from_json(hr::results_to_json(r)).sweep_points[0].time->kernel_calls.empty());
  EXPECT_TRUE(hr::attention_variants(r.sweep_points[0]).empty());
  r.sweep_points[0].time->kernel_calls = {{"attention_forward:cudnn", 4}, {"attention_backward:scalar", 4},
                                          {"matmul:cublas", 12.5}};
  const hr::Results back = hr::results_from_json(hr::results_to_json(r));
  EXPECT_EQ(back.sweep_points[0].time->kernel_calls, r.sweep_points[0].time->kernel_calls);
  EXPECT_EQ(hr::attention_variants(back.sweep_points[0]), (std::set<std::string>{"cudnn", "scalar"}));
  for (const char* bad : {R"({"attention_forward:cudnn": 0})", R"({"attention_forward:cudnn": -1})",
                          R"({"attention_forward:cudnn": "4"})", R"({"": 1})", "[1]"}) {
    auto j = hr::results_to_json(r);
    j["sweep_points"][0]["time"]["kernel_calls"] = nlohmann::json::parse(bad);
    try {
      hr::results_from_json(j, "x.json");
      ADD_FAILURE() << bad;
    } catch (const hr::InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("kernel_calls"), std::string::npos) << e.what();
    }
  }
}

// Why a timed point fell back travels with its time; a file from before has none,
// and a reason that is not a non-empty string, or a field that is not a map, is
// refused, naming it. The label says each direction's reason where they differ.
TEST(ReportResults, KernelFallbacksRoundTripAndAreChecked) {
  hr::Results r = sample_results();
  ASSERT_TRUE(r.sweep_points[0].time.has_value());
  EXPECT_FALSE(hr::results_to_json(r)["sweep_points"][0]["time"].contains("kernel_fallbacks"));
  EXPECT_EQ(hr::attention_fallbacks_label(r.sweep_points[0]), "");
  r.sweep_points[0].time->kernel_fallbacks = {{"attention_forward:cudnn", "segment masks take the own kernels"},
                                              {"attention_backward:cudnn", "segment masks take the own kernels"}};
  // What ran instead is said by the kernel calls: a fallback without them is refused.
  try {
    hr::results_from_json(hr::results_to_json(r), "x.json");
    ADD_FAILURE() << "fallbacks without kernel calls were taken";
  } catch (const hr::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("no kernel_calls of attention_"), std::string::npos) << e.what();
  }
  r.sweep_points[0].time->kernel_calls = {{"attention_forward:scalar", 1}, {"attention_backward:scalar", 1}};
  const hr::Results back = hr::results_from_json(hr::results_to_json(r));
  EXPECT_EQ(back.sweep_points[0].time->kernel_fallbacks, r.sweep_points[0].time->kernel_fallbacks);
  EXPECT_EQ(hr::attention_fallbacks_label(back.sweep_points[0]), "cudnn asked: segment masks take the own kernels");
  r.sweep_points[0].time->kernel_fallbacks["attention_backward:cudnn"] = "no graph";
  EXPECT_EQ(hr::attention_fallbacks_label(r.sweep_points[0]),
            "forward cudnn asked: segment masks take the own kernels; backward cudnn asked: no graph");
  for (const char* bad : {R"({"attention_forward:cudnn": ""})", R"({"attention_forward:cudnn": 1})",
                          R"({"": "why"})", R"({"attention_forward": "why"})", R"({":cudnn": "why"})",
                          R"({"matmul:cublas": "why"})", R"(["why"])"}) {
    auto j = hr::results_to_json(r);
    j["sweep_points"][0]["time"]["kernel_fallbacks"] = nlohmann::json::parse(bad);
    try {
      hr::results_from_json(j, "x.json");
      ADD_FAILURE() << bad;
    } catch (const hr::InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("kernel_fallbacks"), std::string::npos) << e.what();
    }
  }
}

// Adds specs to the registries for one test and takes them out again, so the
// process-wide registries are as they were for every other test.
struct ScopedSpecs {
  size_t props, sweeps;
  ScopedSpecs() : props(hr::property_registry().size()), sweeps(hr::sweep_registry().size()) {}
  ~ScopedSpecs() {
    hr::property_registry().resize(props);
    hr::sweep_registry().resize(sweeps);
  }
};

TEST(ReportRunner, APropertyThatThrowsIsRecordedAndTheRunGoesOn) {
  ScopedSpecs scope;
  hr::property_registry().push_back(hr::PropertySpec{"ZZTEST-1", "throws", 0.1, [](hr::RunContext&) -> std::vector<hr::Measurement> {
                                                        throw hr::Error("deliberate failure");
                                                      }, ""});
  hr::property_registry().push_back(hr::PropertySpec{"ZZTEST-2", "passes", 0.1, [](hr::RunContext& ctx) {
                                                        if (ctx.progress) ctx.progress("a note");
                                                        return std::vector<hr::Measurement>{
                                                            hr::make_check("ZZTEST-2", "", 0.5, 1.0)};
                                                      }, ""});
  hr::sweep_registry().push_back(hr::SweepSpec{"ZZTEST-S", "sweep throws", 0.1, [](hr::RunContext&) -> std::vector<hr::SweepPoint> {
                                                 throw std::runtime_error("sweep broke");
                                               }, {}, ""});
  auto dev = hr::make_cpu_device();
  hr::RunOptions opt;
  opt.only = "^ZZTEST-";
  std::ostringstream progress;
  const hr::Results r = hr::run_suite(*dev, opt, &progress);
  ASSERT_EQ(r.measurements.size(), 2u);
  const auto& err = r.measurements[0];
  EXPECT_EQ(err.id, "ZZTEST-1");
  EXPECT_FALSE(err.passed);
  EXPECT_TRUE(hr::is_error_measurement(err));
  EXPECT_NE(err.details["error"].get<std::string>().find("deliberate failure"), std::string::npos);
  EXPECT_EQ(err.backend, "cpu");
  EXPECT_TRUE(r.measurements[1].passed);
  EXPECT_EQ(r.measurements[1].backend, "cpu");  // filled in by the runner
  ASSERT_EQ(r.sweep_points.size(), 1u);
  EXPECT_EQ(r.sweep_points[0].status, "error");
  EXPECT_NE(r.sweep_points[0].reason.find("sweep broke"), std::string::npos);
  EXPECT_EQ(r.totals.errors, 1);
  EXPECT_EQ(r.totals.failed, 1);
  EXPECT_EQ(r.totals.sweep_points_error, 1);
  ASSERT_EQ(r.timings.size(), 3u);
  EXPECT_FALSE(r.timings[0].error.empty());
  const std::string log = progress.str();
  EXPECT_NE(log.find("[1/3]"), std::string::npos) << log;
  EXPECT_NE(log.find("[3/3]"), std::string::npos) << log;
  EXPECT_NE(log.find("a note"), std::string::npos) << log;
  EXPECT_NE(log.find("left"), std::string::npos) << log;
}

// Progress says each item's outcome as it ends (a sweep's points by status, and by
// sweep where it gives points of others), and inside a long item a line every few
// seconds in which nothing else was said.
TEST(ReportRunner, ProgressSaysEachOutcomeAndBeatsInsideALongItem) {
  ScopedSpecs scope;
  hr::property_registry().push_back(hr::PropertySpec{"ZZTEST-3", "two checks and a missed control", 0.1,
                                                      [](hr::RunContext&) {
                                                        return std::vector<hr::Measurement>{
                                                            hr::make_check("ZZTEST-3", "a", 0.5, 1.0),
                                                            hr::make_check("ZZTEST-3", "b", 2.0, 1.0),
                                                            hr::make_negative_control("ZZTEST-3", "c", 0.5, 1.0)};
                                                      }, ""});
  hr::property_registry().push_back(hr::PropertySpec{"ZZTEST-4", "slow", 0.1, [](hr::RunContext&) {
                                                        std::this_thread::sleep_for(std::chrono::milliseconds(2600));
                                                        return std::vector<hr::Measurement>{
                                                            hr::make_check("ZZTEST-4", "", 0.5, 1.0)};
                                                      }, ""});
  // A sweep whose run gives points of another sweep too, one out of memory.
  hr::sweep_registry().push_back(hr::SweepSpec{"ZZTEST-5", "points of two sweeps", 0.1, [](hr::RunContext&) {
                                                 std::vector<hr::SweepPoint> ps(3);
                                                 for (auto& p : ps) p.backend = "cpu", p.dtype = "fp32", p.model = "mlp";
                                                 ps[0].sweep = ps[1].sweep = "ZZTEST-5";
                                                 ps[2].sweep = "ZZTEST-5X";
                                                 ps[1].status = "out_of_memory", ps[1].reason = "too big";
                                                 return ps;
                                               }, {}, ""});
  auto dev = hr::make_cpu_device();
  hr::RunOptions opt;
  opt.only = "^ZZTEST-[345]$";
  opt.heartbeat_s = 1;
  std::ostringstream progress;
  hr::run_suite(*dev, opt, &progress);
  const std::string log = progress.str();
  EXPECT_NE(log.find("ZZTEST-3: 1 of 2 checks FAILED, 1 of 1 controls NOT caught"), std::string::npos) << log;
  EXPECT_NE(log.find("ZZTEST-4 still running ("), std::string::npos) << log;
  EXPECT_NE(log.find("ZZTEST-4: 1 check passed"), std::string::npos) << log;
  EXPECT_NE(log.find("ZZTEST-5: 3 points (1 out of memory): 2 ZZTEST-5, 1 ZZTEST-5X ("), std::string::npos) << log;
  // The full preset has no measured costs on the CPU: no estimate before an item ends.
  opt.preset = hr::Preset::full;
  opt.only = "^ZZTEST-3$";
  std::ostringstream full;
  hr::run_suite(*dev, opt, &full);
  EXPECT_NE(full.str().find("estimating the time left"), std::string::npos) << full.str();
}

// Two properties that measure nothing, for the selection tests: ZZTEST-A "alpha
// property" and ZZTEST-B "beta property".
void add_alpha_and_beta_specs() {
  auto none = [](hr::RunContext&) { return std::vector<hr::Measurement>{}; };
  hr::property_registry().push_back(hr::PropertySpec{"ZZTEST-A", "alpha property", 0.1, none, ""});
  hr::property_registry().push_back(hr::PropertySpec{"ZZTEST-B", "beta property", 0.1, none, ""});
}

TEST(ReportRunner, OnlyFiltersByIdAndTitleAndRejectsABadRegex) {
  ScopedSpecs scope;
  add_alpha_and_beta_specs();
  hr::RunOptions opt;
  opt.only = "ZZTEST-A";
  EXPECT_EQ(hr::select_specs(opt).size(), 1u);
  opt.only = "BETA PROP";  // case-insensitive, on the title
  EXPECT_EQ(hr::select_specs(opt).size(), 1u);
  opt.only = "(";
  EXPECT_THROW(hr::select_specs(opt), hr::InvalidArgument);
}

TEST(ReportRunner, SkipLeavesOutWhatItMatchesEvenWhenOnlySelectsIt) {
  ScopedSpecs scope;
  add_alpha_and_beta_specs();
  hr::RunOptions opt;
  opt.only = "^ZZTEST-";
  opt.skip = "^zztest-a$";  // case-insensitive, on the id
  const hr::Selection sel = hr::select_specs(opt);
  ASSERT_EQ(sel.size(), 1u);
  EXPECT_EQ(sel.properties.front()->id, "ZZTEST-B");
  opt.skip = "beta";  // on the title
  ASSERT_EQ(hr::select_specs(opt).size(), 1u);
  EXPECT_EQ(hr::select_specs(opt).properties.front()->id, "ZZTEST-A");
  opt.skip = "[";
  EXPECT_THROW(hr::select_specs(opt), hr::InvalidArgument);
}

}  // namespace
