// How every sweep point is measured, the exponent fits and the last run's points (see sweep_support.hpp).
#include "harness/properties/sweep_support.hpp"

#include <cblas.h>  // openblas_{get,set}_num_threads

#include <cmath>
#include <map>
#include <tuple>

#include "harness/check.hpp"

namespace hr::props {

OneBlasThread::OneBlasThread(const Device& dev) : active_(dev.kind() == BackendKind::cpu) {
  if (!active_) return;
  saved_ = openblas_get_num_threads();
  openblas_set_num_threads(1);
}

OneBlasThread::~OneBlasThread() {
  if (active_) openblas_set_num_threads(saved_);
}

SweepPoint sweep_point(const std::string& sweep, const Device& dev, DType dtype, const std::string& model,
                       nlohmann::json config) {
  SweepPoint p;
  p.sweep = sweep;
  p.backend = backend_name(dev.kind());
  p.dtype = dtype_name(dtype);
  p.model = model;
  p.config = std::move(config);
  return p;
}

void measure_point(SweepPoint& p, const std::function<void()>& measure) {
  try {
    measure();
  } catch (const OutOfMemory& e) {
    p.status = "out_of_memory";
    p.reason = e.what();
  }
}

MemorySnapshot time_point(Device& dev, SweepPoint& p, TimingOptions timing, const std::function<void()>& region) {
  const bool cpu = dev.kind() == BackendKind::cpu;
  const OneBlasThread one_blas_thread(dev);
  timing.reference_work = cpu;
  apply_injected_slowdown(p.sweep, p.config, timing, p.metrics);
  dev.synchronize();
  dev.memory().reset_peak();
  const MemorySnapshot before = dev.memory().snapshot();
  p.time = time_region(dev, region, timing);
  p.memory = dev.memory().snapshot();
  p.metrics["noisy"] = p.time->noisy;
  if (cpu) p.metrics["blas_threads"] = openblas_get_num_threads();
  return before;
}

MemorySnapshot peak_point(Device& dev, SweepPoint& p, const std::function<void()>& region) {
  dev.synchronize();
  dev.memory().reset_peak();
  const MemorySnapshot before = dev.memory().snapshot();
  region();
  dev.synchronize();
  p.memory = dev.memory().snapshot();
  record_peak_bytes(p, before);
  return before;
}

void record_peak_bytes(SweepPoint& p, const MemorySnapshot& before) {
  p.metrics["activation_peak_bytes"] = static_cast<double>(p.memory.peak(Consumer::activations));
  p.metrics["pass_peak_bytes"] = static_cast<double>(p.memory.total_peak_bytes - before.total_current_bytes);
  p.metrics["total_peak_bytes"] = static_cast<double>(p.memory.total_peak_bytes);
}

std::optional<PowerFit> fit_series(std::vector<SweepPoint>& points, size_t first, const std::string& x_key,
                                   const std::string& y_metric, const std::string& exponent_key) {
  std::vector<double> xs, ys;
  for (size_t i = first; i < points.size(); ++i) {
    const SweepPoint& p = points[i];
    if (p.status != "ok") continue;
    xs.push_back(p.config.at(x_key).get<double>());
    ys.push_back(p.metrics.at(y_metric).get<double>());
  }
  if (xs.size() < 2) return std::nullopt;
  const PowerFit f = fit_power_law(xs, ys);
  for (size_t i = first; i < points.size(); ++i) {
    points[i].metrics[exponent_key] = f.exponent;
    points[i].metrics[exponent_key + "_r2"] = f.r2;
  }
  return f;
}

double fitted_exponent(std::vector<SweepPoint> series, const std::string& x_key, const std::string& value_key,
                       const std::string& exponent_key, nlohmann::json* points) {
  fit_series(series, 0, x_key, value_key, exponent_key);
  *points = nlohmann::json::array();
  double e = NAN;
  for (const SweepPoint& p : series) {
    if (p.status != "ok") {
      points->push_back({{x_key, p.config[x_key]}, {"status", p.status}});
      continue;
    }
    e = p.metrics.value(exponent_key, NAN);
    points->push_back({{x_key, p.config[x_key]}, {value_key, p.metrics[value_key]}});
  }
  return e;
}

std::vector<SweepPoint> cached_points(const std::string& sweep, const Device& dev, DType dtype, Preset preset,
                                      uint64_t seed, const std::function<std::vector<SweepPoint>()>& measure) {
  using Key = std::tuple<const Device*, DType, Preset, uint64_t>;
  static std::map<std::string, std::pair<Key, std::vector<SweepPoint>>> last;  // per sweep
  const Key key{&dev, dtype, preset, seed};
  auto it = last.find(sweep);
  if (it == last.end() || it->second.first != key) it = last.insert_or_assign(sweep, std::make_pair(key, measure())).first;
  return it->second.second;
}

}  // namespace hr::props
