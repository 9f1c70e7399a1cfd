// Normalisation across the batch under gradient accumulation and checkpointing
// (PROPERTIES.md BN-1..BN-3), as library functions the GoogleTest cases assert on and
// `headroom run` collects. Each runs one compute dtype on one device.
#pragma once

#include <cstdint>
#include <vector>

#include "harness/dtype.hpp"
#include "harness/registry.hpp"

namespace hr::props {

// BN-1: the MLP with BatchNorm, 16 micro-batches of 2 against one batch of 32:
// gradients and running statistics diverge (measured, must exceed a bound); the
// same MLP with LayerNorm agrees within GA-1's bound.
std::vector<Measurement> bn1_accumulation_diverges(Device& dev, DType dtype, Preset preset, uint64_t seed);
// BN-2: ghost batch norm over virtual batches of the micro-batch size inside one
// big batch reproduces the accumulated result (gradients and running statistics).
std::vector<Measurement> bn2_ghost_batch_norm(Device& dev, DType dtype, Preset preset, uint64_t seed);

// BN-3: checkpointing every BatchNorm block recomputes its forward (counted) and
// leaves the running statistics as one forward does; the broken recompute that
// updates them again is caught by the same check.
std::vector<Measurement> bn3_checkpoint_running_stats(Device& dev, DType dtype, Preset preset, uint64_t seed);

}  // namespace hr::props
