// Float64 reference of inverted dropout (see dropout_ref.hpp).
#include "kernels/dropout/dropout_ref.hpp"

#include <cmath>

#include "kernels/common/philox.hpp"

namespace hr::ref {

std::vector<uint8_t> dropout_mask(size_t n, double p, uint64_t seed, uint64_t offset) {
  // keep iff draw >= round(p 2^32): P(keep) = 1 - p up to 2^-33.
  const double threshold = std::nearbyint(p * 4294967296.0);
  std::vector<uint8_t> m(n);
  for (size_t i = 0; i < n; ++i) m[i] = static_cast<double>(philox_draw(seed, offset + i)) >= threshold ? 1 : 0;
  return m;
}

std::vector<double> dropout_forward(const std::vector<double>& x, double p, uint64_t seed, uint64_t offset) {
  const std::vector<uint8_t> m = dropout_mask(x.size(), p, seed, offset);
  std::vector<double> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = m[i] ? x[i] / (1.0 - p) : 0.0;
  return y;
}

}  // namespace hr::ref
