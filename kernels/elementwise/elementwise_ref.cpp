// Float64 references of the element-wise ops (see elementwise_ref.hpp).
#include "kernels/elementwise/elementwise_ref.hpp"

#include "harness/check.hpp"

namespace hr::ref {

std::vector<double> add(const std::vector<double>& a, const std::vector<double>& b) {
  HR_CHECK(a.size() == b.size(), "ref::add sizes {} vs {}", a.size(), b.size());
  std::vector<double> out(a.size());
  for (size_t i = 0; i < a.size(); ++i) out[i] = a[i] + b[i];
  return out;
}

std::vector<double> scale(const std::vector<double>& x, double alpha) {
  std::vector<double> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = alpha * x[i];
  return out;
}

std::vector<double> axpy(double alpha, const std::vector<double>& x, const std::vector<double>& y) {
  HR_CHECK(x.size() == y.size(), "ref::axpy sizes {} vs {}", x.size(), y.size());
  std::vector<double> out(y.size());
  for (size_t i = 0; i < y.size(); ++i) out[i] = y[i] + alpha * x[i];
  return out;
}

std::vector<double> add_bias(const std::vector<double>& y, const std::vector<double>& bias) {
  const size_t c = bias.size();
  HR_CHECK(c > 0 && y.size() % c == 0, "ref::add_bias {} values, {} columns", y.size(), c);
  std::vector<double> out(y.size());
  for (size_t i = 0; i < y.size(); ++i) out[i] = y[i] + bias[i % c];
  return out;
}

std::vector<double> bias_grad(const std::vector<double>& dy, const std::vector<double>& dbias) {
  const size_t c = dbias.size();
  HR_CHECK(c > 0 && dy.size() % c == 0, "ref::bias_grad {} values, {} columns", dy.size(), c);
  std::vector<double> out = dbias;
  for (size_t i = 0; i < dy.size(); ++i) out[i % c] += dy[i];
  return out;
}

}  // namespace hr::ref
