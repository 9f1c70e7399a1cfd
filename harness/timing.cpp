// Timing statistics.
#include "harness/timing.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "harness/check.hpp"

namespace hr {

namespace {
double quantile(const std::vector<double>& sorted, double q) {
  if (sorted.empty()) return 0;
  const double pos = q * static_cast<double>(sorted.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(pos)), hi = static_cast<size_t>(std::ceil(pos));
  return sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - static_cast<double>(lo));
}
}  // namespace

TimeStats summarize_times(std::vector<double> samples) {
  TimeStats t;
  t.reps = static_cast<int>(samples.size());
  t.samples_s = samples;
  if (samples.empty()) return t;
  std::sort(samples.begin(), samples.end());
  t.median_s = quantile(samples, 0.5);
  t.min_s = samples.front();
  t.max_s = samples.back();
  t.mean_s = std::accumulate(samples.begin(), samples.end(), 0.0) / static_cast<double>(samples.size());
  double var = 0;
  for (double s : samples) var += (s - t.mean_s) * (s - t.mean_s);
  t.stddev_s = samples.size() > 1 ? std::sqrt(var / static_cast<double>(samples.size() - 1)) : 0.0;
  std::vector<double> dev;
  for (double s : samples) dev.push_back(std::fabs(s - t.median_s));
  std::sort(dev.begin(), dev.end());
  t.mad_s = quantile(dev, 0.5);
  t.rel_spread = t.median_s > 0 ? (quantile(samples, 0.9) - quantile(samples, 0.1)) / t.median_s : 0.0;
  t.noisy = t.rel_spread > kNoisyRelSpread;
  return t;
}

TimeStats time_region(Device& dev, const std::function<void()>& fn, const TimingOptions& opt) {
  HR_ARG_CHECK(opt.min_reps >= 1 && opt.max_reps >= opt.min_reps, "bad timing repetitions {}..{}",
               opt.min_reps, opt.max_reps);
  for (int i = 0; i < opt.warmup; ++i) fn();
  dev.synchronize();
  auto timer = dev.make_timer();
  std::vector<double> samples;
  double total = 0;
  while (static_cast<int>(samples.size()) < opt.max_reps &&
         (static_cast<int>(samples.size()) < opt.min_reps || total < opt.min_total_s)) {
    timer->start();
    fn();
    const double s = timer->stop_seconds();
    samples.push_back(s);
    total += s;
  }
  return summarize_times(std::move(samples));
}

void to_json(nlohmann::json& j, const TimeStats& t) {
  j = nlohmann::json{{"reps", t.reps},         {"median_s", t.median_s}, {"mean_s", t.mean_s},
                     {"min_s", t.min_s},       {"max_s", t.max_s},       {"stddev_s", t.stddev_s},
                     {"mad_s", t.mad_s},       {"rel_spread", t.rel_spread}, {"noisy", t.noisy}};
}

}  // namespace hr
