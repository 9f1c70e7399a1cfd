// The HTML report rendered from the committed fixture (reports/testdata): every
// section present and filled, hostile strings escaped, nothing fetched or run,
// and sections without data saying "not measured in this run".
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "harness/cli/commands.hpp"
#include "harness/properties/checkpoint_depth.hpp"
#include "harness/results/compare.hpp"
#include "harness/results/results.hpp"
#include "reports/html.hpp"
#include "reports/report.hpp"
#include "reports/svg.hpp"
#include "suites/common/test_support.hpp"

namespace {

namespace fs = std::filesystem;

fs::path testdata() { return fs::path(__FILE__).parent_path() / ".." / ".." / "reports" / "testdata"; }

size_t count(const std::string& hay, const std::string& needle) {
  size_t n = 0;
  for (size_t pos = hay.find(needle); pos != std::string::npos; pos = hay.find(needle, pos + 1)) ++n;
  return n;
}

// The text of one <section id="...">...</section>.
std::string section(const std::string& html, const std::string& id) {
  const auto start = html.find("<section id=\"" + id + "\"");
  if (start == std::string::npos) return "";
  return html.substr(start, html.find("</section>", start) - start);
}

class ReportFixture : public ::testing::Test {
 protected:
  void SetUp() override {
    results = hr::load_results((testdata() / "results.json").string());
    baseline = hr::load_results((testdata() / "baseline_faster.json").string());
    cmp = hr::compare_results(baseline, results);
    peer = hr::read_json_file((testdata() / "results-peer.json").string(), "peer record", size_t{1} << 20);
    hr::report::ReportOptions ro{&baseline, &cmp, "baseline_faster.json"};
    ro.peer = &peer;
    html = hr::report::render_report(results, ro);
  }
  hr::Results results, baseline;
  hr::Comparison cmp;
  nlohmann::json peer;
  std::string html;
};

TEST_F(ReportFixture, PeerSectionSetsTheStepAgainstEachPyTorchForm) {
  const std::string s = section(html, "peer");
  // The headline is against the strongest form: 110,182 / (4096 / 0.041) tokens/s.
  EXPECT_NE(s.find("headroom / PyTorch strongest = 1.10"), std::string::npos) << s;
  EXPECT_NE(s.find("<td>eager</td><td>fp32</td><td>naive</td><td>default</td><td>no</td>"), std::string::npos) << s;
  EXPECT_NE(s.find("<td>strongest</td><td>bf16</td><td>sdpa-flash</td><td>fused</td><td>yes</td>"),
            std::string::npos)
      << s;
  EXPECT_NE(s.find(">74.30<"), std::string::npos) << "eager's step in ms";
  EXPECT_NE(s.find(">2.00<"), std::string::npos) << "headroom / eager: 110,182 / 55,128";
  EXPECT_NE(s.find("compile: &lt;none&gt; &amp; &quot;quoted&quot;"), std::string::npos) << "escaped";
}

// headroom report --peer takes a record of one of the results' BM-MB points only.
TEST(ReportCommand, PeerRecordMustBeOfAPointOfTheResults) {
  const fs::path dir = fs::temp_directory_path() / fmt::format("headroom-peer-{}", ::getpid());
  fs::create_directories(dir);
  const std::string results = (testdata() / "results.json").string(), html = (dir / "r.html").string();
  std::ostringstream out, err;
  EXPECT_EQ(hr::command_report(results, "", html, out, err, (testdata() / "results-peer.json").string()), 0)
      << err.str();
  nlohmann::json other = hr::read_json_file((testdata() / "results-peer.json").string(), "peer", size_t{1} << 20);
  other["headroom_point"]["config"]["micro_batch"] = 64;  // a point that ran out of memory
  const std::string bad = (dir / "peer-other.json").string();
  std::ofstream(bad) << other.dump();
  std::ostringstream out2, err2;
  EXPECT_NE(hr::command_report(results, "", html, out2, err2, bad), 0);
  EXPECT_NE(err2.str().find("is not a BM-MB point of these results"), std::string::npos) << err2.str();
  other.erase("forms");
  std::ofstream(bad) << other.dump();
  std::ostringstream out3, err3;
  EXPECT_NE(hr::command_report(results, "", html, out3, err3, bad), 0);
  EXPECT_NE(err3.str().find("no forms"), std::string::npos) << err3.str();
  fs::remove_all(dir);
}

TEST_F(ReportFixture, HasEverySectionWithData) {
  for (const char* id : hr::report::kSectionIds) {
    const std::string s = section(html, id);
    ASSERT_FALSE(s.empty()) << "missing section " << id;
    EXPECT_EQ(s.find("Not measured in this run"), std::string::npos) << "section " << id << " has no data";
  }
  // Device and build.
  EXPECT_NE(section(html, "device").find("9.0"), std::string::npos);
  EXPECT_NE(section(html, "device").find("0123456789ab"), std::string::npos);
  // The conformance matrix: properties by backend and dtype, headroom and caught controls.
  const std::string conf = section(html, "conformance");
  EXPECT_NE(conf.find("class=\"matrix\""), std::string::npos);
  for (const char* id : {"OPS-1", "OPS-3", "GA-1", "GA-2", "CK-1", "CK-2", "MP-1", "MEM-3", "Q8-3"})
    EXPECT_NE(conf.find(std::string("<b>") + id + "</b>"), std::string::npos) << id;
  EXPECT_NE(conf.find("caught"), std::string::npos);
  EXPECT_NE(conf.find("exact"), std::string::npos);  // a zero error
  EXPECT_GE(count(conf, "<th class=\"mid\">cuda<br>"), 3u);
  // Memory by consumer: stacked bars, one chart per sweep with memory.
  const std::string mem = section(html, "memory");
  EXPECT_GE(count(mem, "<svg"), 4u);
  EXPECT_NE(mem.find("optimizer_state"), std::string::npos);
  // Curves: charts with the fitted exponents in their legends.
  EXPECT_GE(count(section(html, "curve-bm-mb"), "<polyline"), 2u);
  EXPECT_NE(section(html, "curve-bm-mb").find("Host waits per step"), std::string::npos);
  const std::string ck = section(html, "curve-ck-3");
  EXPECT_NE(ck.find("checkpoint=none (exponent 1.00)"), std::string::npos) << ck.substr(0, 400);
  EXPECT_NE(ck.find("checkpoint=sqrt (exponent 0.4"), std::string::npos);
  EXPECT_NE(section(html, "curve-seq").find("attention=naive (exponent"), std::string::npos);
  EXPECT_GE(count(section(html, "curve-q8-3"), "<polyline"), 3u);  // two losses and the drift
  // The trade table in the field guide's order.
  const std::string trade = section(html, "trade");
  EXPECT_LT(trade.find("mixed precision"), trade.find("checkpointing"));
  EXPECT_LT(trade.find("8-bit optimizer"), trade.find("LoRA"));
  // The verdict and why.
  const std::string base = section(html, "baseline");
  EXPECT_NE(base.find("NOT FIT"), std::string::npos);
  EXPECT_NE(base.find("slower by"), std::string::npos);
  EXPECT_NE(base.find("another device"), std::string::npos);
  // The run record lists what did not run.
  EXPECT_NE(section(html, "run").find("out_of_memory"), std::string::npos);
}

TEST_F(ReportFixture, EscapesEveryStringFromOutside) {
  // The device name is <script>alert(1)</script>&"' ; a model is an <img> tag; a
  // config value holds <b> markup.
  EXPECT_EQ(html.find("<script"), std::string::npos);
  EXPECT_EQ(html.find("alert(1)</script>"), std::string::npos);
  EXPECT_EQ(html.find("<img"), std::string::npos);
  EXPECT_EQ(html.find("<b>bold</b>"), std::string::npos);
  EXPECT_NE(html.find("&lt;script&gt;alert(1)&lt;/script&gt;&amp;&quot;&#39;"), std::string::npos);
  EXPECT_NE(html.find("&lt;img src=x onerror=alert(2)&gt;"), std::string::npos);
  EXPECT_NE(html.find("&lt;b&gt;bold&lt;/b&gt; &amp; &quot;quoted&quot;"), std::string::npos);
  // In the <title> too, and in SVG text.
  EXPECT_NE(html.find("<title>headroom report: &lt;script&gt;"), std::string::npos);
}

TEST_F(ReportFixture, IsSelfContained) {
  EXPECT_EQ(html.rfind("<!DOCTYPE html>", 0), 0u);
  EXPECT_NE(html.find("</html>"), std::string::npos);
  EXPECT_EQ(html.find("<script"), std::string::npos);
  EXPECT_EQ(html.find("<link"), std::string::npos);
  for (const char* tag : {"<img", "<iframe", "<object", "<embed", "<video", "<audio"})
    EXPECT_EQ(html.find(tag), std::string::npos) << tag;
  EXPECT_EQ(html.find("src=\""), std::string::npos);
  EXPECT_EQ(html.find("url("), std::string::npos);
  EXPECT_EQ(html.find("@import"), std::string::npos);
  // The only URL is the SVG namespace, which is never fetched.
  size_t urls = 0, svgns = count(html, "http://www.w3.org/2000/svg");
  for (const char* scheme : {"http://", "https://"}) urls += count(html, scheme);
  EXPECT_EQ(urls, svgns);
}

// A quick run on `backend` with nothing in it yet.
hr::Results bare_run(const std::string& backend) {
  hr::Results r;
  r.run_time_utc = "2025-01-01T00:00:00Z";
  r.preset = "quick";
  r.backend = backend;
  r.device = {{"backend", backend}, {"name", backend == "cuda" ? "gpu" : "cpu"}};
  return r;
}

TEST(Report, SectionsWithoutDataSayNotMeasured) {
  hr::Results r = bare_run("cpu");
  hr::compute_totals(r);
  const std::string html = hr::report::render_report(r);
  for (const char* id : hr::report::kSectionIds) EXPECT_FALSE(section(html, id).empty()) << id;
  for (const char* id :
       {"conformance", "memory", "curve-bm-mb", "curve-ck-3", "curve-seq", "curve-q8-3", "trade", "peer"})
    EXPECT_NE(section(html, id).find("Not measured in this run"), std::string::npos) << id;
  EXPECT_NE(section(html, "baseline").find("No baseline was given"), std::string::npos);
  EXPECT_EQ(section(html, "curve-ck-3").find("BM-CK was not run"), std::string::npos);
}

TEST(Report, RunRecordNamesWhatAnInterruptionLeftAndWhatWasRecovered) {
  hr::Results r = hr::load_results((testdata() / "results.json").string());
  const std::string complete = section(hr::report::render_report(r), "run");
  EXPECT_EQ(complete.find("Interrupted"), std::string::npos);
  int oom_before = 0;
  for (const auto& p : r.sweep_points) oom_before += p.status == "out_of_memory";
  r.incomplete = true;
  r.not_run = {"GA-3", "BM-<MB>"};
  hr::SweepPoint oom = r.sweep_points.at(0);
  oom.status = "out_of_memory";
  oom.reason = "asked 3.2 GB, 1.0 GB available";
  r.sweep_points.push_back(oom);
  hr::compute_totals(r);
  const std::string run = section(hr::report::render_report(r), "run");
  EXPECT_NE(run.find("Interrupted.</b> 2 properties and sweeps did not run: GA-3, BM-&lt;MB&gt;"), std::string::npos);
  EXPECT_NE(run.find("--resume"), std::string::npos);
  EXPECT_NE(run.find(fmt::format("Recovered in the run: {} sweep point{} that did not fit", oom_before + 1,
                                 oom_before + 1 == 1 ? "" : "s")),
            std::string::npos);
  EXPECT_NE(run.find("asked 3.2 GB, 1.0 GB available"), std::string::npos);
}

// The attention kernels the timed points ran: in the run table, per kernel with its
// points and sweeps, and per strategy in BM-PK's table (a packed batch's segment
// mask falls back from cuDNN to the scalar kernels); nothing where no point says.
TEST(Report, SaysWhichAttentionKernelsTheTimedPointsRan) {
  hr::Results r = bare_run("cuda");
  r.attention_kernel = "cudnn";
  for (const char* strategy : {"pad_to_max", "packed"}) {
    hr::SweepPoint p;
    p.sweep = "BM-PK";
    p.backend = "cuda";
    p.dtype = "bf16";
    p.model = "transformer";
    p.config = {{"strategy", strategy}};
    p.time = hr::summarize_times({0.01, 0.011, 0.012, 0.01, 0.013, 0.011});
    const std::string kernel = std::string(strategy) == "packed" ? "scalar" : "cudnn";
    p.time->kernel_calls = {{"attention_forward:" + kernel, 4}, {"attention_backward:" + kernel, 4}};
    p.metrics = {{"useful_tokens_per_s", 1000.0}};
    r.sweep_points.push_back(p);
  }
  hr::compute_totals(r);
  const std::string html = hr::report::render_report(r);
  EXPECT_NE(section(html, "device").find("attention kernels timed</td><td>cudnn in 1 point (BM-PK); scalar in 1 "
                                         "point (BM-PK)"),
            std::string::npos)
      << section(html, "device");
  const std::string seq = section(html, "curve-seq");
  const auto packed = seq.find("packed (cuda bf16)");
  ASSERT_NE(packed, std::string::npos) << seq;
  EXPECT_NE(seq.find("<td>scalar</td></tr>", packed), std::string::npos) << seq;
  EXPECT_NE(seq.find("<td>cudnn</td></tr>"), std::string::npos) << seq;
  // A point that fell back says why, beside its kernels and in the device section.
  EXPECT_EQ(section(html, "device").find("attention fallbacks"), std::string::npos);
  r.sweep_points[1].time->kernel_fallbacks = {{"attention_forward:cudnn", "segment masks take the own kernels"},
                                              {"attention_backward:cudnn", "segment masks take the own kernels"}};
  const std::string fell = hr::report::render_report(r);
  EXPECT_NE(section(fell, "curve-seq").find("<td>scalar (cudnn asked: segment masks take the own kernels)</td>"),
            std::string::npos)
      << section(fell, "curve-seq");
  EXPECT_NE(section(fell, "device").find("attention fallbacks</td><td>cudnn asked: segment masks take the own "
                                         "kernels (1 point: BM-PK)"),
            std::string::npos)
      << section(fell, "device");
  // A reason is text, escaped (a library's error may hold markup).
  r.sweep_points[1].time->kernel_fallbacks = {{"attention_forward:cudnn", "<b>no</b> engine & no graph"}};
  const std::string marked = hr::report::render_report(r);
  EXPECT_NE(marked.find("cudnn asked: &lt;b&gt;no&lt;/b&gt; engine &amp; no graph"), std::string::npos);
  EXPECT_EQ(marked.find("<b>no</b> engine"), std::string::npos);
  r.sweep_points[1].time->kernel_fallbacks.clear();
  // A backward that fell back where the forward did not is said by direction.
  r.sweep_points[0].time->kernel_calls["attention_backward:scalar"] = 4;
  r.sweep_points[0].time->kernel_calls.erase("attention_backward:cudnn");
  EXPECT_NE(section(hr::report::render_report(r), "curve-seq").find("<td>forward cudnn, backward scalar</td>"),
            std::string::npos);
  for (auto& p : r.sweep_points) p.time->kernel_calls.clear();
  const std::string unsaid = hr::report::render_report(r);
  EXPECT_EQ(section(unsaid, "device").find("attention kernels timed"), std::string::npos);
  EXPECT_NE(section(unsaid, "curve-seq").find("<td>-</td></tr>"), std::string::npos);
}

// BM-MB's profiled points (HEADROOM_OP_PROFILE) show their device time by op, the
// largest first, with what the profile left outside any op and the ops past the
// first twelve folded into one row; a run without a profile shows no such table.
TEST(Report, BmMbShowsTheDeviceTimeByOpOfProfiledPoints) {
  hr::Results r = bare_run("cuda");
  for (const char* attention : {"naive", "memory_efficient"}) {
    hr::SweepPoint p;
    p.sweep = "BM-MB";
    p.backend = "cuda";
    p.dtype = "bf16";
    p.model = "transformer";
    p.config = {{"micro_batch", 32}, {"accum_steps", 1}, {"attention", attention}};
    p.time = hr::summarize_times({0.100, 0.101, 0.102, 0.100, 0.103, 0.101});
    p.metrics = {{"tokens_per_s", 300000.0}};
    r.sweep_points.push_back(p);
  }
  hr::compute_totals(r);
  EXPECT_EQ(section(hr::report::render_report(r), "curve-bm-mb").find("device time by op"), std::string::npos);
  r.sweep_points[0].time->op_seconds = {{"matmul", 0.050}, {"attention_forward", 0.020}, {"attention_backward", 0.030}};
  for (int i = 0; i < 14; ++i) r.sweep_points[1].time->op_seconds[fmt::format("op{:02}", i)] = 0.001 * (i + 1);
  const std::string bm = section(hr::report::render_report(r), "curve-bm-mb");
  ASSERT_NE(bm.find("device time by op"), std::string::npos) << bm;
  // The naive point: matmul first (50% of the 101 ms step), then the backward, then
  // the forward, then the 1 ms no op holds.
  const auto gemm = bm.find("<td>matmul</td>"), bwd = bm.find("<td>attention_backward</td>"),
             fwd = bm.find("<td>attention_forward</td>");
  ASSERT_NE(gemm, std::string::npos);
  EXPECT_LT(gemm, bwd);
  EXPECT_LT(bwd, fwd);
  EXPECT_NE(bm.find("49.5%", gemm), std::string::npos) << bm;
  EXPECT_NE(bm.find("<td>outside any op</td>", fwd), std::string::npos);
  // The other: 14 ops summing to 105 ms, more than its timed median, so no time is
  // outside an op; the two smallest (1 and 2 ms) folded.
  EXPECT_NE(bm.find("<td>2 other ops</td>"), std::string::npos) << bm;
  EXPECT_EQ(bm.find("<td>op00</td>"), std::string::npos);
  EXPECT_NE(bm.find("<td>op13</td>"), std::string::npos);
  EXPECT_EQ(count(bm, "outside any op"), 1u);
}

// A run with BM-CK, PK-3, BM-PK and BM-FIT but none of the sweeps their sections
// chart (CK-3, PK-4 or BM-SEQ, TRADE) still shows their tables, beside the "not
// measured" of what is missing, every section closed.
TEST(Report, TablesStandWithoutTheirSectionsCurves) {
  hr::Results r = bare_run("cpu");
  for (const char* sweep : {"BM-CK", "BM-PK", "BM-FIT"}) {
    hr::SweepPoint p;
    p.sweep = sweep;
    p.backend = "cpu";
    p.dtype = "fp32";
    p.model = "transformer";
    p.config = {{"checkpoint", "every_block"}, {"strategy", "packed"}, {"technique", "fp32 AdamW"}};
    p.time = hr::summarize_times({0.01, 0.011, 0.012, 0.01, 0.013, 0.011});
    r.sweep_points.push_back(p);
  }
  hr::Measurement pk3 = hr::make_check("PK-3", "pad tokens per strategy", 0.0, 1.0);
  pk3.config = {{"seq_len", 128}, {"batch_rows", 8}};
  pk3.details = {{"pad_fraction",
                  {{"long_tail", {{"mean_length", 40}, {"pad_to_max", 0.6}, {"pad_to_longest", 0.3},
                                  {"bucketed", 0.1}, {"packed", 0.01}}}}}};
  r.measurements.push_back(pk3);
  hr::compute_totals(r);
  const std::string html = hr::report::render_report(r);
  EXPECT_EQ(count(html, "<section "), count(html, "</section>"));
  EXPECT_NE(section(html, "curve-ck-3").find("every_block (cpu fp32)"), std::string::npos) << section(html, "curve-ck-3");
  EXPECT_NE(section(html, "curve-ck-3").find("no CK-3 sweep points"), std::string::npos);
  EXPECT_NE(section(html, "curve-seq").find("packed (cpu fp32)"), std::string::npos) << section(html, "curve-seq");
  EXPECT_NE(section(html, "curve-seq").find("no PK-4 or BM-SEQ sweep points"), std::string::npos);
  EXPECT_NE(section(html, "curve-seq").find("Pad tokens per strategy (PK-3"), std::string::npos);
  EXPECT_NE(section(html, "trade").find("Largest micro-batch that fits (BM-FIT)"), std::string::npos)
      << section(html, "trade");
  EXPECT_NE(section(html, "trade").find("no TRADE sweep points"), std::string::npos);
}

TEST(Report, ShowsFailuresErrorsAndNonFiniteValues) {
  hr::Results r = hr::load_results((testdata() / "results.json").string());
  r.measurements[0].passed = false;
  r.measurements[0].error = std::nan("");
  r.measurements.push_back(hr::make_error_measurement("BN-3", "checkpointed batch norm", "cpu", "it broke <badly>"));
  hr::compute_totals(r);
  const std::string html = hr::report::render_report(r);
  const std::string conf = section(html, "conformance");
  EXPECT_NE(conf.find("Failures (2)"), std::string::npos);
  EXPECT_NE(conf.find("threw: it broke &lt;badly&gt;"), std::string::npos);
  EXPECT_NE(conf.find(">nan<"), std::string::npos);
  EXPECT_NE(conf.find("b-bad\">fail"), std::string::npos);
  EXPECT_NE(conf.find("b-bad\">error"), std::string::npos);
  EXPECT_NE(section(html, "summary").find("card bad"), std::string::npos);
}

TEST(Report, PowerColumnShowsTheSmallestCaughtErrorPerProperty) {
  hr::Results r;
  r.device = {{"name", "cpu"}};
  auto add = [&](hr::Measurement m, const char* dtype) {
    m.backend = "cpu";
    m.dtype = dtype;
    r.measurements.push_back(m);
  };
  add(hr::make_check("GA-1", "accumulated", 1e-6, 1e-5), "fp32");
  add(hr::make_negative_control("GA-1", "no division", 31.0, 1e-5), "fp32");
  add(hr::make_subtle_control("GA-1", "fp16 buffer", 4.2e-4, 1e-5), "fp32");  // power 42x
  add(hr::make_subtle_control("GA-1", "fp16 buffer", 1.3e-2, 4.9e-4), "fp16");
  add(hr::make_check("BN-3", "once", 0.0, 0.0), "fp32");
  add(hr::make_negative_control("BN-3", "twice", NAN, 0.0), "fp32");  // blown up: not caught
  hr::compute_totals(r);
  const std::string conf = section(hr::report::render_report(r), "conformance");
  EXPECT_NE(conf.find("smallest caught"), std::string::npos);
  EXPECT_NE(conf.find("power 42x"), std::string::npos);  // the fp32 cell
  EXPECT_NE(conf.find("2 subtle of 3 controls caught"), std::string::npos);  // the GA-1 row
  EXPECT_NE(conf.find("none<small>1 controls, none caught"), std::string::npos);  // BN-3's NaN
  EXPECT_NE(conf.find(">subtle<"), std::string::npos);
  EXPECT_NE(section(hr::report::render_report(r), "summary").find("2 of 2 subtle"), std::string::npos);
}

TEST(Report, Q83CurveFromAMeasurementsDetails) {
  hr::Results r;
  r.device = {{"name", "cpu"}};
  hr::Measurement m = hr::make_check("Q8-3", "drift", 0.01, 0.05);
  m.details = {{"curve", {{"x", {0, 100, 200}}, {"series", {{"fp32 Adam", {2.0, 1.0, 0.5}}, {"8-bit Adam", {2.0, 1.01, 0.51}}}}}}};
  r.measurements.push_back(m);
  hr::compute_totals(r);
  const std::string q = section(hr::report::render_report(r), "curve-q8-3");
  EXPECT_EQ(q.find("Not measured"), std::string::npos);
  EXPECT_NE(q.find("fp32 Adam"), std::string::npos);
  EXPECT_GE(count(q, "<polyline"), 3u);
}

// The mixed-precision section draws MP-1's exponent histogram (with fp16's 2^-24
// and 2^-14 lines) and MP-3's scale trajectory from the measurements' details.
TEST(Report, MixedPrecisionChartsFromMeasurementsDetails) {
  hr::Results r;
  r.device = {{"name", "cpu"}};
  const std::string empty = section(hr::report::render_report(r), "curve-mp");
  ASSERT_FALSE(empty.empty());
  EXPECT_NE(empty.find("Not measured"), std::string::npos);
  hr::Measurement h = hr::make_check("MP-1", "scaled", 0.0, 1e-3);
  h.details = {{"exponent_histogram", {{"-30", 5}, {"-24", 40}, {"-20", 100}}},
               {"loss_scale", 65536.0},
               {"nonzero_values", 145},
               {"fraction_below_2^-24", 0.03},
               {"flushed_fraction_unscaled", 0.034},
               {"flushed_fraction_scaled", 0.0}};
  hr::Measurement t = hr::make_check("MP-3", "trajectory", 0.0, 0.5);
  t.details = {{"trajectory",
                {{"scale", {65536.0, 65536.0, 32768.0, 65536.0}},
                 {"expected_scale", {65536.0, 65536.0, 32768.0, 65536.0}},
                 {"skipped", {false, true, false, false}},
                 {"growth_interval", 1}}}};
  r.measurements = {h, t};
  hr::compute_totals(r);
  const std::string mp = section(hr::report::render_report(r), "curve-mp");
  EXPECT_EQ(mp.find("Not measured"), std::string::npos);
  EXPECT_NE(mp.find("2^-24: fp16"), std::string::npos);
  EXPECT_NE(mp.find("2^-14: fp16"), std::string::npos);
  EXPECT_NE(mp.find("scaled by 2^16"), std::string::npos);
  EXPECT_NE(mp.find("Skipped steps (an overflowing micro-batch): 1."), std::string::npos);
  EXPECT_GE(count(mp, "<polyline"), 6u);  // 4 histogram series + 2 trajectory series
}

TEST(ReportHtml, EscapesTheFiveCharacters) {
  EXPECT_EQ(hr::report::esc("<a href=\"x\">Tom & Jerry's</a>"),
            "&lt;a href=&quot;x&quot;&gt;Tom &amp; Jerry&#39;s&lt;/a&gt;");
  EXPECT_EQ(hr::report::esc("plain"), "plain");
}

TEST(ReportHtml, FormatsNumbers) {
  EXPECT_EQ(hr::report::fmt_num(std::nan("")), "nan");
  EXPECT_EQ(hr::report::fmt_num(INFINITY), "inf");
  EXPECT_EQ(hr::report::fmt_num(1234567), "1,234,567");
  EXPECT_EQ(hr::report::fmt_bytes_short(1536), "1.5 KiB");
  EXPECT_EQ(hr::report::fmt_seconds(0.0042), "4.2 ms");
  EXPECT_EQ(hr::report::fmt_pct(0.123), "+12.3%");
  EXPECT_EQ(hr::report::fmt_si(1024), "1024");
  EXPECT_EQ(hr::report::fmt_si(123456), "123k");
}

TEST(ReportSvg, TicksCoverTheRange) {
  const auto t = hr::report::linear_ticks(0, 381, 5);
  ASSERT_GE(t.size(), 3u);
  EXPECT_EQ(t.front(), 0);
  EXPECT_GE(t.back(), 300);
  const auto l = hr::report::log_ticks(3, 5000);
  ASSERT_GE(l.size(), 3u);
  EXPECT_GE(l.front(), 3);
  EXPECT_LE(l.back(), 5000);
  const auto b = hr::report::bytes_ticks(0, 381.0 * (1 << 20));
  ASSERT_GE(b.size(), 3u);
  EXPECT_DOUBLE_EQ(b[1], 100.0 * (1 << 20));  // steps of whole MiB
  const auto p = hr::report::log2_ticks(3e6, 2e8);
  ASSERT_GE(p.size(), 2u);
  for (double v : p) EXPECT_EQ(std::exp2(std::round(std::log2(v))), v);
}

TEST(ReportSvg, ChartsEscapeLabelsAndDropUnplottablePoints) {
  hr::report::Series s{"<x>", {{1, 2}, {2, std::nan("")}, {0, 5}, {4, 8}}, "", false};
  hr::report::ChartOptions o;
  o.title = "t<itle>";
  o.log_x = true;
  const std::string svg = hr::report::line_chart({s}, o);
  EXPECT_EQ(svg.find("<x>"), std::string::npos);
  EXPECT_NE(svg.find("&lt;x&gt;"), std::string::npos);
  EXPECT_EQ(svg.find("nan"), std::string::npos);
  EXPECT_EQ(count(svg, "<circle cx"), 2u + 1u);  // two plotted points and the legend marker
  const std::string empty = hr::report::line_chart({}, o);
  EXPECT_NE(empty.find("no data"), std::string::npos);
}

// The depth section drawn from a run made here (not the fixture): CK-3's points on
// this device, the exponents fitted from them in the legends (~1 plain, ~0.5 with
// sqrt(L) segments), the pass-peak chart, and BM-CK's overhead table.
TEST(ReportDepth, DrawnFromTheRunItself) {
  HR_TEST_DEVICE(dev, hr::BackendKind::cpu);
  hr::Results r;
  r.sweep_points = hr::props::ck3_depth_sweep(dev, hr::DType::f32, hr::Preset::quick, 5);
  const auto bm = hr::props::run_checkpoint_bench(dev, hr::props::checkpoint_bench_smoke_config(), 5);
  r.sweep_points.insert(r.sweep_points.end(), bm.begin(), bm.end());
  const std::string ck = section(hr::report::render_report(r), "curve-ck-3");
  ASSERT_FALSE(ck.empty());
  EXPECT_NE(ck.find("checkpoint=none (exponent 0.9"), std::string::npos) << ck.substr(0, 600);
  EXPECT_NE(ck.find("checkpoint=sqrt_L (exponent 0.5"), std::string::npos);
  EXPECT_NE(ck.find("Peak bytes of the pass"), std::string::npos);
  EXPECT_NE(ck.find("every_block (cpu fp32)"), std::string::npos);
  EXPECT_EQ(ck.find("BM-CK was not run"), std::string::npos);
  EXPECT_EQ(ck.find("Not measured in this run"), std::string::npos);
}

}  // namespace
