// The data-parallel part of `headroom dump --ranks N`: run by every rank of the
// headroom-dp worker under mpirun, each writes DIR/rank_<r>/step_<s>/ for the steps
// of the dump (at least one):
//   batch.safetensors            its slice of the step's batch: rows [r B / N, (r + 1) B / N)
//   gradients_local.safetensors  what it sent to the all-reduce: its K micro-batches'
//                                plain sums over real items (loss divisor 1)
//   gradients.safetensors        the all-reduced sums divided by the window's global
//                                real-item count (all-reduced too)
//   optimizer_state.safetensors  its ZeRO-1 shard after the step: exp_avg and
//                                exp_avg_sq, fp32, of the flat elements it owns
//   weights.safetensors          the parameters after the step (shards all-gathered)
// The single-process reference and conventions.json are dump_model's
// (harness/dump/dump.hpp), written before the ranks start.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "harness/device.hpp"
#include "harness/dist/communicator.hpp"
#include "harness/dump/dump.hpp"
#include "harness/step/step_config.hpp"

namespace hr::dist {

// Files this rank wrote.
int64_t dump_rank(Device& dev, Communicator& comm, const StepConfig& cfg, const DumpOptions& opt,
                  const std::string& dir);

// ZeRO-1's shards of `total` flat elements over `ranks`: rank r owns
// [min(P, r s), min(P, (r + 1) s)) with s = ceil(P / N) (Zero1AdamW's rule).
std::vector<std::pair<int64_t, int64_t>> zero1_shards(int64_t total, int64_t ranks);

}  // namespace hr::dist
