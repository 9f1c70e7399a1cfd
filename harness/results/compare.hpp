// Comparing a run against a baseline run: the verdict of `headroom validate` and
// the table of `headroom compare`. Conformance is absolute (every measurement of
// the run must pass); time and memory are relative to the baseline, per matching
// sweep point (same sweep, backend, dtype, model and config), with thresholds
// drawn from the noise both runs recorded so that noise is not called a regression.
#pragma once

#include <nlohmann/json.hpp>

#include <limits>
#include <string>
#include <vector>

#include "harness/results/results.hpp"

namespace hr {

struct CompareOptions {
  // A time change within this fraction is "same" whatever the noise: below it no
  // two runs on two machines are expected to agree.
  double time_floor = 0.05;
  // Memory is deterministic: peaks agree within this fraction or differ.
  double memory_tolerance = 0.01;
};

// One compared quantity of one sweep point.
struct CompareRow {
  std::string sweep, backend, dtype, model;
  nlohmann::json config = nlohmann::json::object();
  std::string quantity;  // "step time" | "peak bytes" | "peak <consumer>" | "status"
  double baseline = std::numeric_limits<double>::quiet_NaN();
  double current = std::numeric_limits<double>::quiet_NaN();
  double change = std::numeric_limits<double>::quiet_NaN();     // current / baseline - 1
  double threshold = std::numeric_limits<double>::quiet_NaN();  // |change| allowed as "same"
  // "same" | "better" | "regression" | "noisy" | "missing" | "new"
  std::string verdict;
  std::string note;
};

struct Comparison {
  std::vector<CompareRow> rows;
  std::vector<std::string> failures;  // each a reason the run is not fit
  std::vector<std::string> warnings;  // flags that do not decide the verdict
  int matched_points = 0, regressions = 0, improvements = 0, noisy = 0, missing = 0, added = 0;
  int conformance_failed = 0;
  bool same_device = true;
  CompareOptions options;
  bool fit() const { return failures.empty(); }
};

// Per-run relative timing noise: max(rel_spread, 4 * mad / median). Both estimate
// the width of the middle 80% of the samples ((p90 - p10) is ~2.6 sigma for a
// normal; so is 4 * MAD); the larger guards against a spread taken from few reps.
double timing_noise(const TimeStats& t);

Comparison compare_results(const Results& baseline, const Results& current, const CompareOptions& opt = {});

// The comparison as plain text (table, flags, verdict) for stdout.
std::string format_comparison_text(const Results& baseline, const Results& current, const Comparison& c);

// "mb=4 accum=8" from a config object (keys sorted, strings unquoted).
std::string config_label(const nlohmann::json& config);

}  // namespace hr
