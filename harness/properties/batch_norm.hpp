// Normalisation across the batch under gradient accumulation and checkpointing
// (docs/catalogue.md BN-1..BN-3), as library functions the GoogleTest cases assert on and
// `headroom run` collects. Each runs one compute dtype on one device.
#pragma once

#include <cstdint>
#include <vector>

#include "harness/dtype.hpp"
#include "harness/registry.hpp"

namespace hr::props {

// BN-1: the MLP with BatchNorm, 16 micro-batches of 2 against one batch of 32:
// gradients and running statistics diverge (measured, must exceed a bound; the
// smallest divergence, 2 micro-batches of 16, is the subtle control); the same
// MLP with LayerNorm agrees within GA-1's bound, and a LayerNorm that leaks a
// fraction of the batch mean into each row is caught by that bound.
std::vector<Measurement> bn1_accumulation_diverges(Device& dev, DType dtype, Preset preset, uint64_t seed);
// BN-2: ghost batch norm over virtual batches of the micro-batch size (2, 4, 8)
// inside one big batch reproduces the accumulated result: gradients within a
// bound from the batch's BatchNorm conditioning, running statistics within a
// rounding bound; ghost batches that take in a fraction of their neighbour's rows
// are caught (subtle controls).
std::vector<Measurement> bn2_ghost_batch_norm(Device& dev, DType dtype, Preset preset, uint64_t seed);

// BN-3: checkpointing every BatchNorm block recomputes its forward (counted) and
// leaves the running statistics, and the gradients, bit for bit as without
// checkpointing; a recompute that updates the statistics again, in every channel
// (gross) or in one (subtle), is caught by the same check.
std::vector<Measurement> bn3_checkpoint_running_stats(Device& dev, DType dtype, Preset preset, uint64_t seed);

// Each returns its measurements and never throws: an fp16 overflow is handled as
// the dynamic loss scaler would (the scale backs off), and anything else that
// throws becomes one failed measurement, so one dtype cannot take the others' with it.

}  // namespace hr::props
