// Error measures the properties report (docs/catalogue.md): norm-wise relative L2
// (the catalogue's default) and bitwise mismatch counts. A NaN in the result, or
// an inf the reference does not have, makes the error NaN, which no tolerance
// accepts. NMSE is the op conformance measure (OPS-1), as in ggml's test-backend-ops.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace hr {

// ||x - ref||_2 / ||ref||_2. An inf in x counts as equal only where ref holds the
// same inf. An all-zero reference gives inf unless x is all zero too (then 0).
double rel_l2(const std::vector<float>& x, const std::vector<double>& ref);
double rel_l2(const std::vector<float>& x, const std::vector<float>& ref);

// sum (a - b)^2 / sum b^2 over the finite reference values. A NaN in `got` gives
// NaN and an inf gives inf (neither passes a bound), except an inf equal to the
// reference's own inf; an all-zero reference gives 0 when `got` is all zero, else inf.
double nmse(const std::vector<float>& got, const std::vector<double>& want);

// Number of bytes that differ (sizes must match; a size mismatch counts every byte).
size_t bitwise_mismatches(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b);

}  // namespace hr
