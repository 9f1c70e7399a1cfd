// Scaling exponents from measurements: the least-squares slope of log y on log x.
// Memory against sequence length (PK-4: ~2 naive, ~1 memory-efficient attention)
// and against depth (CK-3: ~1 plain, ~0.5 with sqrt(L) checkpoint segments).
#pragma once

#include <vector>

namespace hr {

struct PowerFit {
  double exponent = 0;   // slope b of log y = log a + b log x
  double prefactor = 0;  // a
  double r2 = 0;         // coefficient of determination of the log-log fit
};

// Needs at least two points with distinct x; every x and y must be > 0.
PowerFit fit_power_law(const std::vector<double>& x, const std::vector<double>& y);

}  // namespace hr
