// Exponent fits and the last run's points, shared by CK-3 and PK-4 (see sweep_support.hpp).
#include "harness/properties/sweep_support.hpp"

#include <cmath>
#include <map>
#include <tuple>

namespace hr::props {

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
