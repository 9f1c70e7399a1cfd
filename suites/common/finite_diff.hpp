// Central finite differences in float64, the OPS-2 reference for every backward
// pass: d f / d x_i = (f(x + h e_i) - f(x - h e_i)) / 2h with h relative to |x_i|.
#pragma once

#include <algorithm>
#include <cmath>
#include <functional>
#include <vector>

namespace hr::test {

// Gradient of the scalar f at x. h = rel_step * max(1, |x_i|): with float64 and
// rel_step 1e-6 both truncation (h^2) and cancellation (eps |f| / h) stay ~1e-10.
inline std::vector<double> finite_diff_grad(const std::function<double(const std::vector<double>&)>& f,
                                            std::vector<double> x, double rel_step = 1e-6) {
  std::vector<double> g(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double x0 = x[i];
    const double h = rel_step * std::max(1.0, std::fabs(x0));
    x[i] = x0 + h;
    const double fp = f(x);
    x[i] = x0 - h;
    const double fm = f(x);
    x[i] = x0;
    g[i] = (fp - fm) / (2 * h);
  }
  return g;
}

// sum_i a_i b_i: the scalar loss <y, g> whose gradient with respect to y is g.
inline double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) s += a[i] * b[i];
  return s;
}

}  // namespace hr::test
