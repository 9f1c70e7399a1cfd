// DP-1..DP-4 and BM-DP (docs/catalogue.md DP): data parallelism checked across the
// ranks of a Communicator. These functions are collective: every rank of the job
// calls them with the same arguments; the returned measurements and sweep points
// are complete on rank 0 (the other ranks' numbers are gathered there). The
// headroom-dp worker runs them under mpirun; `headroom run` launches that worker
// (harness/dist/launch.hpp).
#pragma once

#include <cstdint>
#include <vector>

#include "harness/dist/communicator.hpp"
#include "harness/registry.hpp"

namespace hr::props {

struct DpOutput {
  std::vector<Measurement> measurements;
  // "DP-MEM": bytes per consumer on each rank (unsharded and ZeRO-1 steps);
  // "DP-COMM": bytes communicated per step, once per window and per micro-batch.
  std::vector<SweepPoint> points;
};

// DP-1..DP-4 at one seed on comm.size() ranks.
DpOutput dp_properties(Device& dev, dist::Communicator& comm, Preset preset, uint64_t seed);

// BM-DP: all-reduce time, algbw and busbw against message size, and the
// data-parallel step time, at comm.size() ranks.
std::vector<SweepPoint> bm_dp(Device& dev, dist::Communicator& comm, Preset preset);

}  // namespace hr::props
