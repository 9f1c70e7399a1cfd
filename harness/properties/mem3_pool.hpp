// MEM-3: the tracking allocator's peak against a device pool's own high-water mark of
// used bytes, over a real training step (many small allocations, where the pool's
// rounding shows). The logic runs on any Device that keeps such a count
// (pool_used_high_bytes); the CUDA backend does (its stream-ordered pool), the CPU
// backend does not, so `headroom run` emits MEM-3 only on a GPU. Tests drive it on
// the CPU through a Device that rounds and counts like a pool.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include <nlohmann/json.hpp>

#include "harness/registry.hpp"
#include "harness/step/step_config.hpp"

namespace hr {

// The comparison itself: error = |pool - tracker| / tracker. The pool rounds every
// allocation up, so pool >= tracker; a pool below the tracker means the tracker counts
// bytes that were never handed out. Details: the difference, per live allocation.
struct PoolComparison {
  double error = 0;
  nlohmann::json details;
};
PoolComparison compare_pool_peak(size_t tracker_peak_bytes, size_t pool_high_bytes, uint64_t peak_live_allocations);

// The step MEM-3 runs (a transformer: a few hundred allocations from 256 bytes to MiBs).
StepConfig mem3_step_config(Preset preset);

// The check and its negative controls (a buffer the pool holds and the tracker does
// not count: subtle, ~5% of the peak; gross, the size of the peak). Empty when the
// device keeps no count of its own.
std::vector<Measurement> mem3_pool_check(Device& dev, const StepConfig& cfg, uint64_t seed);

}  // namespace hr
