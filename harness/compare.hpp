// Error measures between a computed tensor and a reference, used by every
// conformance property and test: NMSE (ggml test-backend-ops' metric), norm-wise
// relative L2 (the catalogue's default) and bitwise mismatch counts. A NaN in the
// result, or an inf the reference does not have, makes the error NaN, which no
// tolerance accepts.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace hr {

// sum (x - ref)^2 / sum ref^2. An inf in x counts as equal only where ref holds the
// same inf. An all-zero reference gives inf unless x is all zero too (then 0).
double nmse(const std::vector<float>& x, const std::vector<double>& ref);
double nmse(const std::vector<float>& x, const std::vector<float>& ref);

// ||x - ref||_2 / ||ref||_2 with the same non-finite rules as nmse.
double rel_l2(const std::vector<float>& x, const std::vector<double>& ref);
double rel_l2(const std::vector<float>& x, const std::vector<float>& ref);

// Number of bytes that differ (sizes must match; a size mismatch counts every byte).
size_t bitwise_mismatches(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b);

std::vector<double> to_double(const std::vector<float>& v);

}  // namespace hr
