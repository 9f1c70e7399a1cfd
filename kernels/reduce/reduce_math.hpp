// Scalar pieces of the reductions, shared by the CPU loops and the CUDA kernels.
// The non-finite test looks at the exponent bits, so it holds under any
// floating-point flags (fast-math would let std::isfinite fold to true).
#pragma once

#include <cstdint>

#include "kernels/common/float16.hpp"
#include "kernels/common/hd.hpp"

namespace hr::reduce {

HR_HD bool nonfinite(float x) { return (float_bits(x) & 0x7f800000u) == 0x7f800000u; }

// The per-element term of each sum.
struct Identity {
  HR_HD double operator()(float x) const { return static_cast<double>(x); }
};
struct Square {
  HR_HD double operator()(float x) const { return static_cast<double>(x) * static_cast<double>(x); }
};

}  // namespace hr::reduce
