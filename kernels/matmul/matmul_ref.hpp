// Float64 reference for the matrix products: a plain triple loop over host
// vectors of double, deliberately simple, for OPS-1 and finite differences.
#pragma once

#include <cstdint>
#include <vector>

namespace hr::ref {

// c = alpha * op(a) op(b) + beta * c over `batch` entries; a, b, c row-major and
// contiguous, op(a) [m, k], op(b) [k, n], c [m, n] per entry. Returns the new c.
std::vector<double> matmul(const std::vector<double>& a, bool trans_a, const std::vector<double>& b, bool trans_b,
                           const std::vector<double>& c, int64_t batch, int64_t m, int64_t n, int64_t k,
                           double alpha = 1.0, double beta = 0.0);

// y [n, out] = x [n, in] w^T + bias (bias may be empty).
std::vector<double> linear(const std::vector<double>& x, const std::vector<double>& w,
                           const std::vector<double>& bias, int64_t n, int64_t in, int64_t out);

}  // namespace hr::ref
