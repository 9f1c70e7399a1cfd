// PK-4 (docs/catalogue.md): memory-efficient attention equals naive attention in the
// model (loss and every gradient, fp32), and the peak bytes of a training pass grow
// with sequence length T like T^2 with naive attention (the T x T probabilities)
// and like T with memory-efficient attention. BM-SEQ: step time and activation
// peak against T for both forms.
#pragma once

#include <vector>

#include "harness/registry.hpp"
#include "harness/step/step_config.hpp"
#include "harness/timing.hpp"

namespace hr::props {

// Sequence lengths of the PK-4 curve: {256, 512, 1024, 2048} (both presets: one
// row of one layer, so that the T^2 term dominates from the first point).
std::vector<int64_t> pk4_seq_lens(Preset preset);
StepConfig pk4_config(DType dtype, int64_t seq_len, bool memory_efficient);

// One forward + backward at T: peaks of the activations and of everything the pass
// allocated (workspace included). Points carry config.seq_len and config.attention.
SweepPoint measure_seq_point(Device& dev, DType dtype, int64_t seq_len, bool memory_efficient, uint64_t seed);
// Every T for both forms; each point carries its series' fitted exponents.
std::vector<SweepPoint> pk4_seq_sweep(Device& dev, DType dtype, Preset preset, uint64_t seed);
std::vector<Measurement> pk4_attention(Device& dev, DType dtype, Preset preset, uint64_t seed);

// BM-SEQ: training steps timed per T and attention form (the PK model's width).
std::vector<SweepPoint> run_seq_bench(Device& dev, Preset preset, uint64_t seed);

}  // namespace hr::props
