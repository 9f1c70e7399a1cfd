// Timing a region on a Device: warm-up runs first, then repetitions each timed on
// its own (CUDA events on the GPU, a steady clock on the CPU), summarised by the
// median and the spread. A result whose spread is too large says so.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <functional>
#include <vector>

#include "harness/device.hpp"

namespace hr {

struct TimeStats {
  int reps = 0;
  double median_s = 0, mean_s = 0, min_s = 0, max_s = 0;
  double stddev_s = 0;
  double mad_s = 0;           // median absolute deviation
  double rel_spread = 0;      // (p90 - p10) / median; noise measure used by comparisons
  bool noisy = false;         // rel_spread above kNoisyRelSpread
  std::vector<double> samples_s;
};
void to_json(nlohmann::json& j, const TimeStats& t);

// Relative spread above which a timing is flagged as too noisy to compare.
inline constexpr double kNoisyRelSpread = 0.25;

TimeStats summarize_times(std::vector<double> samples_s);

struct TimingOptions {
  int warmup = 2;
  int min_reps = 5;
  int max_reps = 50;
  double min_total_s = 0.2;  // keep repeating (up to max_reps) until this much was timed
};

// Times fn() on `dev`; fn must enqueue all its work on the device's stream.
TimeStats time_region(Device& dev, const std::function<void()>& fn, const TimingOptions& opt = {});

}  // namespace hr
