// The Philox stream drawn on the host, as a component with fault switches (one
// family of harness/faults.hpp) for OPS-3's controls: the stream cuRAND's host
// generator must equal, and the round function Random123's known answers check.
// The draws are kernels/common/philox.hpp's; the switches break them here only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "harness/faults.hpp"
#include "kernels/common/philox.hpp"

namespace hr {

struct PhiloxFault {
  bool naive_counter_order = false;  // counter = the draw block, without cuRAND's 65536-thread order
  int64_t flip_draw = -1;            // >= 0: this draw (of a fill) or output word (of a round) has flip_mask xored in
  uint32_t flip_mask = 0;
};
using ScopedPhiloxFault = faults::Scoped<PhiloxFault>;

// Draws offset .. offset + n - 1 of the seed's stream.
std::vector<uint32_t> philox_host_draws(uint64_t seed, uint64_t offset, size_t n);

// Ten rounds of Philox4x32 on the host (philox4x32_10), the faults applied.
Philox4 philox4x32_10_host(Philox4 ctr, uint32_t k0, uint32_t k1);

}  // namespace hr

HR_DECLARE_FAULT_SLOT(hr::PhiloxFault);
