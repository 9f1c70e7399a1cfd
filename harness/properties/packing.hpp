// PK-1 / PK-2 (docs/catalogue.md): a packed row trains every sequence in it as if the
// sequence ran alone, through the whole transformer, with naive and with
// memory-efficient attention; packing without the boundary mask or without
// restarting positions is caught by the same check.
#pragma once

#include <vector>

#include "harness/data/batch.hpp"
#include "harness/properties/accum_support.hpp"
#include "harness/registry.hpp"
#include "harness/step/step_config.hpp"

namespace hr::props {

// The PK model: one head of 32 dimensions (a size the CUDA kernels take), rows of
// 64 tokens, no dropout, loss divided by the batch's real tokens.
StepConfig pk_config(DType dtype, bool memory_efficient);
// The model BM-SEQ and BM-PK time: pk_config with rows of seq_len tokens; in the full
// preset a model of d_model 512, 8 heads, 4 layers and a 32768-token vocabulary.
// Its timing: the defaults in the full preset, 1 warm-up and 3-5 repetitions in the quick one.
StepConfig pk_bench_config(DType dtype, bool memory_efficient, Preset preset, int64_t seq_len);
TimingOptions pk_bench_timing(Preset preset);
// Sequence lengths uniform in [8, seq_len]: every sequence has targets and rows mix
// long and short ones.
std::vector<int64_t> pk1_lengths(int64_t count, int64_t seq_len, uint64_t seed);

// One forward + backward of a fresh step (parameters from cfg.init_seed) sized to
// the batch's rows: the loss and every trainable gradient.
struct PassResult {
  double loss = 0;
  NamedValues grads;
};
PassResult run_fresh_pass(Device& dev, StepConfig cfg, const Batch& batch);
// max(relative loss error, worst tensor's relative L2 (compare_tensors)); NaN when
// either is. *details gets both and the worst tensor's name.
double pass_error(const PassResult& got, const PassResult& ref, const ZeroGradientRule& zero, nlohmann::json* details);

std::vector<Measurement> pk1_packing(Device& dev, DType dtype, Preset preset, uint64_t seed);

}  // namespace hr::props
