// Float64 reference of inverted dropout for OPS-1/OPS-2: the keep decision drawn
// straight from hr::philox_draw per element (no block batching), scale 1/(1-p)
// in double.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace hr::ref {

std::vector<uint8_t> dropout_mask(size_t n, double p, uint64_t seed, uint64_t offset);
std::vector<double> dropout_forward(const std::vector<double>& x, double p, uint64_t seed, uint64_t offset);

}  // namespace hr::ref
