// DP-1..DP-6 and BM-DP (docs/catalogue.md DP): data parallelism checked across the
// ranks of a Communicator. These functions are collective: every rank of the job
// calls them with the same arguments; the returned measurements and sweep points
// are complete on rank 0 (the other ranks' numbers are gathered there). The
// headroom-dp worker runs them under mpirun; `headroom run` launches that worker
// (harness/dist/launch.hpp).
#pragma once

#include <cstdint>
#include <string>
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

// Which of them: DP-1..DP-4 with ZeRO-1's Zero1AdamW (data_parallel), the sharded
// step's DP-3 setting, DP-5, DP-6 and their DP-MEM and DP-COMM rows (sharding), or both.
enum class DpPart : uint8_t { all, data_parallel, sharding };
DpPart parse_dp_part(const std::string& s);  // "all" | "data_parallel" | "sharding"

// DP-1..DP-6 at one seed on comm.size() ranks.
DpOutput dp_properties(Device& dev, dist::Communicator& comm, Preset preset, uint64_t seed,
                       DpPart part = DpPart::all);

// BM-DP: all-reduce time, algbw and busbw against message size, and the
// data-parallel step time, at comm.size() ranks.
std::vector<SweepPoint> bm_dp(Device& dev, dist::Communicator& comm, Preset preset);

}  // namespace hr::props
