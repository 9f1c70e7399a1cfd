// `headroom fleet`: every device of a node or a cluster checked at once, device by
// device. One process per device (rank), launched by mpirun (one node: --ranks N;
// across nodes: HEADROOM_MPIRUN_ARGS="--hostfile hosts", or the ranks started by
// Slurm's srun with `headroom fleet-rank`), each bound to its GPU or, standing in for
// one, running the CPU backend. The ranks share nothing but the output folder: each
// one's supervisor runs the level's work in a child process, bounded by the level's
// time budget, and writes the device's record (rank_<r>.json) whatever happens to
// the child, so a device that crashes, hangs or loses its context is a failed device
// and the others go on. The driver then judges the records side by side:
// - wrong: its step digest differs from the majority of devices of its kind, driver
//   and build, or from its own second run, or a conformance check failed on it;
// - slow: its step, GEMM or copy throughput (the median of its rounds, each round's
//   fastest repetition) lies below the other devices' median by more than the floor
//   and by more than their spread allows (3.5 deviations from their median absolute
//   deviation; while any device's median is behind the fastest other's by more than the floor after 3
//   rounds of timing, all are timed one round more, up to 12 and within a deadline
//   of their own), or below the baseline's (harness/tolerances.hpp kFleetSlow*);
// - failed: it gave no complete record (crashed, timed out, no device).
// Writes fleet.json (headroom.fleet/2), fleet.html and, when asked, JUnit; exit 1
// when any device is not ok.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "harness/device.hpp"
#include "harness/registry.hpp"

namespace hr::fleet {

// /2: a throughput is the median of the device's rounds (in /1, its fastest round,
// which a baseline of /1 would hold above what this judges: it is refused).
inline constexpr const char* kFleetSchema = "headroom.fleet/2";
inline constexpr const char* kRankSchema = "headroom.fleet.rank/1";

// The environment variables of the fleet's fault switches, read by the ranks:
// HEADROOM_INJECT_SDC=R flips one bit of one matrix product's output on rank R
// during its first digest (kernels/common/op_fault.hpp); HEADROOM_INJECT_FLEET_EXIT=R
// makes rank R's work exit mid-level (at the start of its digest). A
// slow device is HEADROOM_INJECT_SLOWDOWN='FLEET-STEP:rank=R:2' (harness/timing.hpp),
// one slow in some rounds only 'FLEET-STEP:rank=R,round=K:2;...'.
inline constexpr const char* kInjectSdcEnv = "HEADROOM_INJECT_SDC";
inline constexpr const char* kInjectExitEnv = "HEADROOM_INJECT_FLEET_EXIT";
// HEADROOM_INJECT_FLEET_HANG=R: rank R's work stops answering at the start of its
// digest (sleeps until its supervisor kills it at the budget).
inline constexpr const char* kInjectHangEnv = "HEADROOM_INJECT_FLEET_HANG";
// HEADROOM_INJECT_FLEET_HANG_TIMED=R: the same in its second round of throughput,
// while the other CPU ranks wait for it at their barriers.
inline constexpr const char* kInjectHangTimedEnv = "HEADROOM_INJECT_FLEET_HANG_TIMED";

// What a level runs and the time it is given per device (the supervisor's limit).
struct Level {
  int number = 1;
  std::string what;         // for people
  Preset preset = Preset::quick;
  std::string only, skip;   // the conformance selection (RunOptions)
  double budget_s_cpu = 0;  // a CPU rank, up to 4 ranks on 2 cores
  double budget_s_gpu = 0;  // one H200
  bool all_reduce = false;  // level 3: the fleet-wide all-reduce sweep after the devices
  double budget_s(BackendKind b) const { return b == BackendKind::cuda ? budget_s_gpu : budget_s_cpu; }
};
const Level& level(int number);  // 1, 2 or 3; InvalidArgument otherwise

// Where this process sits in the launch, from its launcher's environment: Open MPI
// (OMPI_COMM_WORLD_*), PMIx (PMIX_RANK), MPICH's Hydra (PMI_RANK, MPI_LOCALRANKID)
// or Slurm (SLURM_PROCID, SLURM_LOCALID, SLURM_NTASKS). Alone: rank 0 of 1.
struct RankPlace {
  int rank = 0, size = 1, local_rank = 0;
  std::string launcher = "none";
};
RankPlace rank_place();

struct RankOptions {
  std::string dir;       // the fleet's output folder (shared by every node)
  int level = 1;
  uint64_t seed = 1234;
  std::string backend = "cpu";
  double budget_s = 0;   // each device's time limit; 0: the level's
};
// One rank: supervises the level's work in a child process and writes
// <dir>/rank_<r>.json. Returns 0 whatever the device did (a failure is a record):
// a non-zero exit would make mpirun end the other ranks.
int run_rank(const RankOptions& opt, std::ostream& err);
// The level's work on this rank's device, in the supervisor's child process
// (`headroom fleet-rank --child`): writes the work record at each phase; 0 when
// done, 3 when it threw.
int rank_work(const RankOptions& opt);

// The judgement of the rank records (index = rank; null for a rank that wrote
// none), against a baseline fleet.json when one is given (else null).
nlohmann::json judge_fleet(const std::vector<nlohmann::json>& ranks, const nlohmann::json& baseline,
                           BackendKind backend);

struct FleetOptions {
  int ranks = 4;
  int level = 1;
  uint64_t seed = 1234;
  std::string backend = "auto";
  std::string out = "fleet";
  std::string baseline;  // an earlier fleet.json, for throughput against it
  std::string junit;
  double budget_s = 0;   // each device's time limit; 0: the level's
  // Launch nothing: judge the records that ranks started elsewhere (Slurm's srun
  // running `headroom fleet-rank`) left in `out`; a rank without one is failed.
  bool judge_only = false;
};
// Launches the ranks, waits for them (the level's budget and a margin), judges,
// writes fleet.json and fleet.html (and JUnit), prints a line per device. Returns
// 0 when every device is ok, 1 when any is not, 2 when the fleet could not be launched.
int run_fleet(const FleetOptions& opt, std::ostream& out, std::ostream& err);

// JUnit XML of a judged fleet: a test case per device and check.
std::string fleet_junit(const nlohmann::json& fleet);

}  // namespace hr::fleet
