// Gradient accumulation properties (docs/catalogue.md GA-1..GA-4), as library
// functions the GoogleTest cases assert on and `headroom run` collects. Each runs
// one compute dtype on one device; the registered specs run fp32, fp16 and bf16.
#pragma once

#include <cstdint>
#include <vector>

#include "harness/dtype.hpp"
#include "harness/registry.hpp"

namespace hr::props {

// GA-1: K micro-batches, each loss divided by K, give the full-batch gradient.
// Both models, effective batch 32, micro-batch 1..32.
std::vector<Measurement> ga1_accumulated_gradient(Device& dev, DType dtype, Preset preset, uint64_t seed);
// GA-2: without the division the accumulated gradient is K times the full
// batch's (ratio of norms measured) and GA-1's check catches it.
std::vector<Measurement> ga2_no_division(Device& dev, DType dtype, Preset preset, uint64_t seed);
// GA-3: one optimizer step (SGD, AdamW) from the accumulated gradient gives the
// large-batch step's parameters.
std::vector<Measurement> ga3_optimizer_step(Device& dev, DType dtype, Preset preset, uint64_t seed);
// GA-4: padded variable-length rows: per-micro-batch token means divided by K
// differ from the full batch, more so as K grows; the sum over the window's
// real tokens matches it.
std::vector<Measurement> ga4_variable_length(Device& dev, DType dtype, Preset preset, uint64_t seed);

}  // namespace hr::props
