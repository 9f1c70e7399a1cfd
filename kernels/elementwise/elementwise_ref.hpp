// Float64 references of the element-wise ops for OPS-1: deliberately plain loops
// over host vectors of double, no storage rounding.
#pragma once

#include <cstdint>
#include <vector>

namespace hr::ref {

std::vector<double> add(const std::vector<double>& a, const std::vector<double>& b);
std::vector<double> scale(const std::vector<double>& x, double alpha);
std::vector<double> axpy(double alpha, const std::vector<double>& x, const std::vector<double>& y);
std::vector<double> add_bias(const std::vector<double>& y, const std::vector<double>& bias);  // y is [N, C]
// dbias[c] + sum_n dy[n, c]
std::vector<double> bias_grad(const std::vector<double>& dy, const std::vector<double>& dbias);

}  // namespace hr::ref
