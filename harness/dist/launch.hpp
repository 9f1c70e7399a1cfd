// How `headroom run` (one process) runs the data-parallel properties and BM-DP:
// it launches `mpirun -np N headroom-dp ...` for each rank count, the worker's
// ranks do the collective work, rank 0 writes its measurements and sweep points as
// JSON, and the run records them. A missing mpirun or worker is a stated skip, a
// failed launch a recorded error; neither stops the run.
#pragma once

#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <vector>

namespace hr::dist {

// The rank counts a run launches: {2, 4} unless `headroom run --ranks N` chose one.
std::vector<int> dp_rank_counts();
void set_dp_rank_counts(std::vector<int> ranks);

// mpirun: $HEADROOM_MPIRUN, else `mpirun` on PATH. Empty when absent.
std::string find_mpirun();
// The worker: $HEADROOM_DP_WORKER, else headroom-dp beside this executable, else
// the one this build made. Empty when absent.
std::string find_dp_worker();
// Empty when the DP entries can run here; otherwise why not (for a skip).
std::string dp_unavailable_reason();

struct WorkerRun {
  bool ok = false;             // exit status 0 or 1 (1: a measurement failed) and JSON written
  std::string error;           // why not, with the tail of the log
  nlohmann::json output;       // what rank 0 wrote
  std::string command;         // the command line, for the record
  double seconds = 0;
};

// Runs `mpirun -np ranks <mpirun options> headroom-dp <args> --out FILE` and reads
// FILE. Options: --oversubscribe (more ranks than cores), --bind-to none, the
// shared-memory transport only (`--mca btl self,vader`), waiting ranks yielding
// their core (mpi_yield_when_idle: 4 ranks on 2 cores), the root permission a
// container needs, then $HEADROOM_MPIRUN_ARGS (e.g. "--hostfile hosts" across
// nodes), split at spaces. Gives up after timeout_s.
WorkerRun run_dp_worker(int ranks, const std::vector<std::string>& args, double timeout_s);

}  // namespace hr::dist
