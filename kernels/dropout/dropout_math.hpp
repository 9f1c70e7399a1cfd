// Scalar math of inverted dropout, shared by the CPU loop and the CUDA kernel.
// The keep decision is an integer comparison of a Philox draw against a threshold,
// so both backends (and any replay) make the same decision bit for bit; the kept
// value is one fp32 multiply by a host-computed scale, also the same everywhere.
#pragma once

#include <cstdint>

#include "kernels/common/hd.hpp"

namespace hr::dropout {

HR_HD bool keep(uint32_t draw, uint32_t threshold) { return draw >= threshold; }
HR_HD float apply(float x, bool kept, float scale) { return kept ? x * scale : 0.f; }

}  // namespace hr::dropout
