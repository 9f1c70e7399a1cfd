// Log-log least-squares fit (see fit.hpp).
#include "harness/fit.hpp"

#include <cmath>

#include "harness/check.hpp"

namespace hr {

PowerFit fit_power_law(const std::vector<double>& x, const std::vector<double>& y) {
  HR_CHECK(x.size() == y.size() && x.size() >= 2, "fit_power_law: {} x against {} y (need >= 2 points)",
           x.size(), y.size());
  const double n = static_cast<double>(x.size());
  double sx = 0, sy = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    HR_CHECK(x[i] > 0 && y[i] > 0, "fit_power_law: point {} is ({}, {}); logs need positive values", i, x[i], y[i]);
    sx += std::log(x[i]);
    sy += std::log(y[i]);
  }
  const double mx = sx / n, my = sy / n;
  double sxx = 0, sxy = 0, syy = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double dx = std::log(x[i]) - mx, dy = std::log(y[i]) - my;
    sxx += dx * dx;
    sxy += dx * dy;
    syy += dy * dy;
  }
  HR_CHECK(sxx > 0, "fit_power_law: every x is the same");
  PowerFit f;
  f.exponent = sxy / sxx;
  f.prefactor = std::exp(my - f.exponent * mx);
  f.r2 = syy > 0 ? (sxy * sxy) / (sxx * syy) : 1.0;
  return f;
}

}  // namespace hr
