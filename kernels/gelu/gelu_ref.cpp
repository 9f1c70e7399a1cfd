// Float64 reference of GELU (see gelu_ref.hpp).
#include "kernels/gelu/gelu_ref.hpp"

#include <cmath>

#include "harness/check.hpp"

namespace hr::ref {

namespace {
const double kSqrt2OverPi = std::sqrt(2.0 / M_PI);
constexpr double kCubic = 0.044715;
}  // namespace

double gelu(double x) { return 0.5 * x * (1.0 + std::tanh(kSqrt2OverPi * (x + kCubic * x * x * x))); }

std::vector<double> gelu_forward(const std::vector<double>& x) {
  std::vector<double> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = gelu(x[i]);
  return y;
}

std::vector<double> gelu_backward(const std::vector<double>& x, const std::vector<double>& dy) {
  HR_CHECK(x.size() == dy.size(), "ref::gelu_backward sizes {} vs {}", x.size(), dy.size());
  std::vector<double> dx(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double t = std::tanh(kSqrt2OverPi * (x[i] + kCubic * x[i] * x[i] * x[i]));
    const double du = kSqrt2OverPi * (1.0 + 3.0 * kCubic * x[i] * x[i]);
    dx[i] = dy[i] * (0.5 * (1.0 + t) + 0.5 * x[i] * (1.0 - t * t) * du);
  }
  return dx;
}

}  // namespace hr::ref
