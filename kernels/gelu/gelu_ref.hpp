// Float64 reference of GELU (tanh form) for OPS-1, and the forward that OPS-2's
// finite differences differentiate.
#pragma once

#include <vector>

namespace hr::ref {

double gelu(double x);
std::vector<double> gelu_forward(const std::vector<double>& x);
// dx = dy * gelu'(x), the analytic derivative in double.
std::vector<double> gelu_backward(const std::vector<double>& x, const std::vector<double>& dy);

}  // namespace hr::ref
