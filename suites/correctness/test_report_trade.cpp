// The report's trade section from TRADE and BM-FIT points built here: bytes by consumer,
// useful tokens/s, the loss against the baseline with a row that breaks training marked,
// the micro-batch that fits per row (with a disagreement with the model shown), and the
// BM-FIT table; a run without BM-FIT still draws the trade table.
#include <gtest/gtest.h>

#include <string>

#include "harness/results/results.hpp"
#include "reports/report.hpp"

namespace hr {
namespace {

std::string section(const std::string& html, const std::string& id) {
  const auto start = html.find("<section id=\"" + id + "\"");
  if (start == std::string::npos) return "";
  return html.substr(start, html.find("</section>", start) - start);
}

SweepPoint trade_point(const std::string& key, const std::string& technique, double loss_error, size_t activations,
                       int fit) {
  SweepPoint p;
  p.sweep = "TRADE";
  p.backend = "cpu";
  p.dtype = "fp32";
  p.model = "transformer";
  p.config = {{"technique", technique}, {"key", key}};
  TimeStats t;
  t.reps = 3;
  t.median_s = 0.125;
  p.time = t;
  p.memory.peak_bytes[static_cast<int>(Consumer::weights)] = 3 * 1024 * 1024;
  p.memory.peak_bytes[static_cast<int>(Consumer::activations)] = activations;
  p.memory.total_peak_bytes = 3 * 1024 * 1024 + activations;
  p.metrics = {{"tokens_per_s", 4096.0},   {"useful_tokens_per_s", 777.0}, {"loss_error", loss_error},
               {"loss_bound", 0.02},       {"loss_reference", key == "lora" ? "lora_reference" : "baseline"},
               {"fit_micro_batch", fit}};
  return p;
}

SweepPoint fit_point(const std::string& key, int found, int model) {
  SweepPoint p;
  p.sweep = "BM-FIT";
  p.backend = "cpu";
  p.dtype = "fp32";
  p.model = "transformer";
  p.config = {{"technique", key}, {"key", key}, {"budget_bytes", 27001856}};
  p.metrics = {{"fit_micro_batch", found},
               {"predicted_fit_micro_batch", model},
               {"probes", 4},
               {"peak_bytes_at_fit", 26000000},
               {"safety_margin_bytes", 1001856},
               {"safety_margin_fraction", 0.037}};
  return p;
}

TEST(ReportTrade, ColumnsLossMarkAndFit) {
  Results r;
  r.backend = "cpu";
  r.preset = "quick";
  r.sweep_points.push_back(trade_point("baseline", "baseline", 0.0, 40 * 1024 * 1024, 2));
  r.sweep_points.push_back(trade_point("mixed_precision", "+ mixed precision", 0.004, 20 * 1024 * 1024, 3));
  r.sweep_points.push_back(trade_point("adamw8bit", "+ 8-bit broken", 0.5, 1024 * 1024, 13));
  r.sweep_points.push_back(trade_point("lora", "+ LoRA", 0.0001, 1024 * 1024, 18));
  r.sweep_points.push_back(fit_point("baseline", 2, 2));
  r.sweep_points.push_back(fit_point("mixed_precision", 3, 3));
  r.sweep_points.push_back(fit_point("adamw8bit", 13, 12));  // the search and the model disagree
  const std::string trade = section(report::render_report(r), "trade");
  ASSERT_FALSE(trade.empty());
  for (const char* col : {"By consumer", "all / useful tokens", "Loss vs baseline", "Fits<br><small>micro-batch"})
    EXPECT_NE(trade.find(col), std::string::npos) << col;
  EXPECT_NE(trade.find("A&nbsp;40 MiB"), std::string::npos) << "activations by consumer";
  EXPECT_NE(trade.find("777 tok/s"), std::string::npos);
  // The broken row, and only it, is marked.
  const auto broken = trade.find("+ 8-bit broken");
  const auto mark = trade.find("breaks training</span>");
  ASSERT_NE(mark, std::string::npos);
  EXPECT_GT(mark, broken);
  EXPECT_LT(mark, trade.find("+ LoRA"));
  const std::string badge = "b-bad\">breaks training";
  const auto first_badge = trade.find(badge);
  ASSERT_NE(first_badge, std::string::npos);
  EXPECT_EQ(trade.find(badge, first_badge + 1), std::string::npos) << "one row marked";
  EXPECT_NE(trade.find("(vs lora_reference)"), std::string::npos);
  EXPECT_NE(trade.find("model 12"), std::string::npos) << "a search that disagrees with the model is shown";
  EXPECT_NE(trade.find("Largest micro-batch that fits (BM-FIT)"), std::string::npos);
  EXPECT_NE(trade.find("25.8 MiB"), std::string::npos) << "the budget";
}

TEST(ReportTrade, WithoutFitPointsTheTableStands) {
  Results r;
  r.sweep_points.push_back(trade_point("baseline", "baseline", 0.0, 1024, 2));
  r.sweep_points.back().metrics.erase("fit_micro_batch");
  r.sweep_points.back().metrics.erase("loss_error");
  const std::string trade = section(report::render_report(r), "trade");
  EXPECT_NE(trade.find("baseline"), std::string::npos);
  EXPECT_EQ(trade.find("BM-FIT)</h3>"), std::string::npos);
  EXPECT_EQ(trade.find("breaks training</span>"), std::string::npos);
}

}  // namespace
}  // namespace hr
