// How `headroom run` (one process) runs the data-parallel properties and BM-DP:
// it launches `mpirun -np N headroom-dp ...` for each rank count, the worker's
// ranks do the collective work, rank 0 writes its measurements and sweep points as
// JSON, and the run records them. A missing mpirun or worker is a stated skip, a
// failed launch a recorded error; neither stops the run.
#pragma once

#include <nlohmann/json.hpp>

#include <functional>
#include <limits>
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

// One child process: argv[0] executed with argv and env (every string prepared
// before the fork: a process with other threads may call only async-signal-safe
// functions between fork and exec), its standard output and error in log_path, in
// a process group of its own, sent death_signal by the kernel when this process
// ends however it ends (it dies with us). After timeout_s its whole group is killed
// (SIGKILL). started(pid) is called once it runs; tick() about every 0.2 s while it
// does. Shared by mpirun's launch and the fleet's rank supervisor.
struct ChildOptions {
  std::string log_path;
  double timeout_s = std::numeric_limits<double>::infinity();
  int death_signal = 15;  // SIGTERM
  std::function<void(int pid)> started;
  std::function<void()> tick;
};
struct ChildRun {
  bool ran = false;        // false: the fork failed
  int status = 0;          // waitpid's status
  bool timed_out = false;  // killed at timeout_s
  double seconds = 0;
};
ChildRun run_child(const std::vector<std::string>& argv, const std::vector<std::string>& env, const ChildOptions& opt);
// This process's environment ("NAME=value" each) without the entries that start with
// any of `prefixes`: the base of a child's env.
std::vector<std::string> environment_except(const std::vector<std::string>& prefixes);

// One mpirun launch: `mpirun -np ranks <options> program args...` with its output
// (every rank's) in log_path. Options: --oversubscribe (more ranks than cores),
// --bind-to none, the shared-memory transport only (`--mca btl self,vader`), waiting
// ranks yielding their core (mpi_yield_when_idle: 4 ranks on 2 cores), the root
// permission a container needs, then $HEADROOM_MPIRUN_ARGS (e.g. "--hostfile hosts"
// across nodes), split at spaces. mpirun is in a process group of its own that dies
// with this process; after timeout_s the whole group is killed. tick() (when set) is
// called about every 0.2 s while it runs.
struct MpirunRun {
  int exit_code = -1;      // mpirun's exit status; -1 when it died of a signal or never ran
  bool timed_out = false;
  double seconds = 0;
  std::string command;     // the command line, for the record
  std::string error;       // why it did not run (no mpirun, fork failed)
};
MpirunRun launch_mpirun(int ranks, const std::string& program, const std::vector<std::string>& args,
                        double timeout_s, const std::string& log_path, const std::function<void()>& tick = {});
// The last max_chars characters of a log.
std::string log_tail(const std::string& path, size_t max_chars);

struct WorkerRun {
  bool ok = false;             // exit status 0 or 1 (1: a measurement failed) and JSON written
  std::string error;           // why not, with the tail of the log
  nlohmann::json output;       // what rank 0 wrote
  std::string command;         // the command line, for the record
  double seconds = 0;
};

// Runs `mpirun -np ranks <mpirun options> headroom-dp <args> --out FILE` through
// launch_mpirun and reads FILE. Gives up after timeout_s.
WorkerRun run_dp_worker(int ranks, const std::vector<std::string>& args, double timeout_s);

}  // namespace hr::dist
