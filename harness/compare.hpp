// Error measures the properties report (PROPERTIES.md): norm-wise relative L2
// (the catalogue's default) and bitwise mismatch counts. A NaN in the result, or
// an inf the reference does not have, makes the error NaN, which no tolerance
// accepts. (The op tests' NMSE lives with them, in suites/common/op_check.hpp.)
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace hr {

// ||x - ref||_2 / ||ref||_2. An inf in x counts as equal only where ref holds the
// same inf. An all-zero reference gives inf unless x is all zero too (then 0).
double rel_l2(const std::vector<float>& x, const std::vector<double>& ref);
double rel_l2(const std::vector<float>& x, const std::vector<float>& ref);

// Number of bytes that differ (sizes must match; a size mismatch counts every byte).
size_t bitwise_mismatches(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b);

}  // namespace hr
