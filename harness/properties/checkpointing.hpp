// CK-1, CK-2, CK-4, CK-5 (activation checkpointing with dropout replayed) and
// GA-6 (dropout under accumulation with per-sample keyed masks), as run by
// `headroom run` and asserted by suites/correctness/test_checkpointing.cpp.
#pragma once

#include <vector>

#include "harness/registry.hpp"
#include "harness/step/step_config.hpp"

namespace hr::props {

// The step CK-* run: dropout on at every site, K = 2 micro-batches, 4 blocks.
StepConfig ck_config(ModelKind model, DType dtype, Preset preset);
// Segment sizes k in {1, 2, ceil(sqrt L), L} (distinct, ascending).
std::vector<int64_t> ck_segment_sizes(int64_t blocks);

std::vector<Measurement> ck1_bitwise_replay(Device& dev, DType dtype, Preset preset, uint64_t seed);
std::vector<Measurement> ck2_fresh_rng(Device& dev, DType dtype, Preset preset, uint64_t seed);
std::vector<Measurement> ck4_forward_counts(Device& dev, DType dtype, Preset preset, uint64_t seed);
std::vector<Measurement> ck5_every_site(Device& dev, DType dtype, Preset preset, uint64_t seed);
std::vector<Measurement> ga6_keyed_dropout(Device& dev, DType dtype, Preset preset, uint64_t seed);

}  // namespace hr::props
