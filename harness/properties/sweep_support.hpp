// What sweeps that fit a scaling exponent share (CK-3 against depth, PK-4 against
// sequence length): the log-log fit of one series of points, written into each of
// its points, and the points of the last run kept so that the property judging the
// exponents and the sweep drawing them measure once.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "harness/dtype.hpp"
#include "harness/fit.hpp"
#include "harness/registry.hpp"

namespace hr::props {

// Fits metrics[y_metric] against config[x_key] over the ok points of
// points[first, end) and writes metrics[exponent_key] (and exponent_key + "_r2")
// into each of them. nullopt (nothing written) with fewer than two ok points.
std::optional<PowerFit> fit_series(std::vector<SweepPoint>& points, size_t first, const std::string& x_key,
                                   const std::string& y_metric, const std::string& exponent_key);

// A series measured apart from the sweep (a control's faulted run): fits it as
// fit_series does and returns the exponent (NaN when no point is ok), with the
// points in *points ({x_key, value_key} each, or the status of one that did not run).
double fitted_exponent(std::vector<SweepPoint> series, const std::string& x_key, const std::string& value_key,
                       const std::string& exponent_key, nlohmann::json* points);

// The points `measure` returns for (sweep, device, dtype, preset, seed), measured
// once per process for the last such key: byte counts are exact and do not depend
// on when they are taken, so the property and the sweep read the same points.
std::vector<SweepPoint> cached_points(const std::string& sweep, const Device& dev, DType dtype, Preset preset,
                                      uint64_t seed, const std::function<std::vector<SweepPoint>()>& measure);

}  // namespace hr::props
