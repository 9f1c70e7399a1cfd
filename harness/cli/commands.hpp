// The subcommands of `headroom` as functions returning the exit code, so the
// tests can drive them without a process: run, validate, compare, report.
// Exit codes: 0 = every property passed / fit; 1 = something failed / not fit /
// partial, a property or sweep point ended in error, or nothing was measured;
// 2 = bad input (arguments, a selection that matches nothing, unreadable or
// other-schema files or ones holding impossible values, an unavailable backend or
// a baseline this machine cannot match, an output that cannot be written or that
// is an input, an output folder another run is writing into); 130 / 143 = interrupted by SIGINT /
// SIGTERM after writing what finished as a results file marked incomplete. Progress and errors go to err,
// tables and the paths written to out.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "harness/fleet/fleet.hpp"
#include "harness/registry.hpp"
#include "harness/results/compare.hpp"

namespace hr {

struct RunCommand {
  std::string preset = "quick";  // "quick" | "full"
  std::string backend = "auto";  // "auto" | "cpu" | "cuda"
  std::string only;              // regex over property/sweep id and title
  std::string skip;              // regex over the same: left out even when selected
  std::string out_dir = "results";
  uint64_t seed = 1234;
  // `run --resume DIR`: finish the interrupted run whose results.json is in DIR
  // (its preset, backend, seed and --only; written back into DIR).
  std::string resume_dir;
  // Whether --only / --skip were given (even empty): with --resume they replace the
  // file's selection, which must still hold everything the run finished, so a run
  // (complete or not) takes on entries it left out, and nothing measured is lost.
  bool only_given = false, skip_given = false;
  // --ranks: the data-parallel entries' rank counts (empty: 2 and 4); kept in
  // results.json, so --resume launches the same.
  std::vector<int> dp_ranks;
  std::string junit;  // --junit FILE: one test case per check and sweep point (harness/results/junit.hpp)
};

// Which of validate's run options were given on the command line: the others are
// taken from the baseline (its preset, backend, seed, selection and rank counts).
struct GivenRunOptions {
  bool preset = false, backend = false, seed = false, only = false, skip = false, ranks = false;
};

struct ValidateCommand {
  std::string baseline;  // trusted results.json
  std::string results;   // a results.json to judge; empty = run the suite now with `run`
  RunCommand run;
  std::string html;      // with `results`: where to write the report with the verdict (optional)
  CompareOptions compare;
  GivenRunOptions given;
  // --any-device: judge a run on a device other than the baseline's (another GPU
  // model); refused otherwise, before anything runs, since its times would differ.
  bool any_device = false;
};

// `headroom dump`: one training step of a controlled model as safetensors files
// (harness/dump/dump.hpp). The step is the preset's configuration of the model,
// with the fields of config_file (a JSON object as StepConfig's to_json writes
// it) and the explicit options laid over it.
struct DumpCommand {
  std::string model = "transformer";  // "mlp" | "transformer"
  std::string preset = "quick";
  std::string config_file;  // optional JSON overrides
  std::string dtype;        // optional: precision.compute
  int64_t batch = 0, micro_batch = 0;  // 0 = the preset's
  std::string backend = "cpu";
  std::string out_dir = "dump";
  uint64_t data_seed = 1;
  int64_t steps = 0;                    // optimizer steps (0: one pass, no step)
  std::vector<int64_t> overflow_steps;  // 1-based; fp16 with loss scaling
  std::string layout = "padded";        // "padded" | "packed"
  std::vector<int64_t> lengths;         // transformer sequence lengths; empty: drawn
  double lora_b_std = 0;                // > 0: adapters.b_init_std
  int64_t ranks = 0;                    // > 0: data parallel under mpirun
};

// `headroom list`: every property and sweep of the suite with its kind, title, what it
// needs, whether it runs here and its expected time.
struct ListCommand {
  std::string preset = "quick";
  std::string backend = "auto";
  bool json = false;
};
int command_list(const ListCommand& c, std::ostream& out, std::ostream& err);

// `headroom info`: the device record as JSON; a backend that is not here is bad input (2).
// `headroom fleet` and a rank of it (`headroom fleet-rank`, what mpirun starts):
// harness/fleet/fleet.hpp.
int command_fleet(const fleet::FleetOptions& opt, std::ostream& out, std::ostream& err);
int command_fleet_rank(const fleet::RankOptions& opt, bool child, std::ostream& err);
int command_info(const std::string& backend, std::ostream& out, std::ostream& err);
int command_run(const RunCommand& c, std::ostream& out, std::ostream& err);
int command_dump(const DumpCommand& c, std::ostream& out, std::ostream& err);
int command_validate(const ValidateCommand& c, std::ostream& out, std::ostream& err);
// Compares B (the run judged) against A (the baseline); exit code as validate.
int command_compare(const std::string& a, const std::string& b, const std::string& html, std::ostream& out,
                    std::ostream& err, const CompareOptions& opt = {});
// Renders the report of a results file (with a baseline comparison when given,
// and ci/peer/torch_step.py's record of the same step when `peer` names one).
int command_report(const std::string& results, const std::string& baseline, const std::string& html,
                   std::ostream& out, std::ostream& err, const std::string& peer = "");

}  // namespace hr
