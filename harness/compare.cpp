// Error measures between results and references (see compare.hpp).
#include "harness/compare.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "harness/check.hpp"

namespace hr {
namespace {

// Sums of squared differences and squared references; false when x holds a value
// that must never pass (NaN, or an inf the reference does not share).
template <typename R>
bool squared_sums(const std::vector<float>& x, const std::vector<R>& ref, double& diff2, double& ref2) {
  HR_CHECK(x.size() == ref.size(), "comparing {} values against a reference of {}", x.size(), ref.size());
  diff2 = 0;
  ref2 = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double a = x[i];
    const double r = static_cast<double>(ref[i]);
    if (std::isnan(a)) return false;
    if (std::isinf(a) || std::isinf(r)) {
      if (a != r) return false;
      continue;
    }
    diff2 += (a - r) * (a - r);
    ref2 += r * r;
  }
  return true;
}

// Squared relative L2 (NaN when x holds a value that must never pass).
template <typename R>
double rel_l2_squared(const std::vector<float>& x, const std::vector<R>& ref) {
  double d2 = 0, r2 = 0;
  if (!squared_sums(x, ref, d2, r2)) return std::numeric_limits<double>::quiet_NaN();
  if (r2 == 0) return d2 == 0 ? 0.0 : std::numeric_limits<double>::infinity();
  return d2 / r2;
}

}  // namespace

double rel_l2(const std::vector<float>& x, const std::vector<double>& ref) {
  return std::sqrt(rel_l2_squared(x, ref));
}
double rel_l2(const std::vector<float>& x, const std::vector<float>& ref) {
  return std::sqrt(rel_l2_squared(x, ref));
}

size_t bitwise_mismatches(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  if (a.size() != b.size()) return std::max(a.size(), b.size());
  size_t n = 0;
  for (size_t i = 0; i < a.size(); ++i) n += a[i] != b[i];
  return n;
}

double nmse(const std::vector<float>& got, const std::vector<double>& want) {
  if (got.size() != want.size()) return INFINITY;
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    // An inf passes only where the reference has the same inf (OPS-1); it then
    // adds nothing to either sum. A NaN anywhere poisons the result.
    if (std::isinf(want[i]) && static_cast<double>(got[i]) == want[i]) continue;
    if (std::isinf(want[i]) || std::isinf(got[i])) return INFINITY;
    const double d = static_cast<double>(got[i]) - want[i];
    num += d * d;
    den += want[i] * want[i];
  }
  if (std::isnan(num)) return NAN;  // NaN never passes: NaN <= bound is false
  if (den == 0) return num == 0 ? 0.0 : INFINITY;
  return num / den;
}

}  // namespace hr
