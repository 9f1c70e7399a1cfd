// The results of one `headroom run`, as kept in memory and in results.json
// (schema "headroom.results/1"). One file per run: the device and build records,
// every property measurement, every sweep point, totals. Written atomically so a
// reader never sees half a file; loaded with a schema check so a file of another
// version is refused with a message that says so, rather than misread.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "harness/registry.hpp"

namespace hr {

inline constexpr const char* kResultsSchema = "headroom.results/1";

// What the totals of a run count. A negative control counts as passed when caught.
struct RunTotals {
  int measurements = 0;
  int passed = 0;
  int failed = 0;
  int errors = 0;  // measurements standing for a property that threw (also failed)
  int negative_controls = 0;
  int negative_controls_caught = 0;
  int subtle_controls = 0;         // negative controls within kSubtleControlMaxPower of the bound
  int subtle_controls_caught = 0;
  int sweep_points = 0;
  int sweep_points_ok = 0;
  int sweep_points_out_of_memory = 0;
  int sweep_points_skipped = 0;
  int sweep_points_error = 0;
  int specs_skipped = 0;  // properties and sweeps that could not run here (SpecTiming::skipped)
};

// How long one registered property or sweep took, for progress estimates and
// for the report's record of the run.
struct SpecTiming {
  std::string kind;  // "property" | "sweep"
  std::string id, title;
  double seconds = 0;
  double expected_seconds_quick = 0;
  int items = 0;      // measurements or sweep points it produced
  std::string error;  // what it threw, if it threw
  std::string skipped;  // why it could not run here (it threw Skipped), if it did not
};

// What the host was doing while a run ran, for judging its timings: a comparison
// made while other work took the host's cores says "too noisy to judge" for step
// times it would otherwise call slower (harness/results/compare.hpp). Read from
// /proc (Linux); a field that cannot be read stays negative.
struct HostLoad {
  int cpus = 0;                 // online CPUs
  double load_avg_start = -1;   // 1-minute load average at the start and at the end
  double load_avg_end = -1;
  // Over the run: how many CPUs were busy with work other than this process, on
  // average ((busy time of all CPUs - this process's CPU time) / wall time), and
  // the fraction of CPU time the hypervisor took (steal).
  double other_busy_cpus = -1;
  double steal_fraction = -1;
  double wall_s = 0;
  // Whether the host was busy enough that step times are not comparable: other
  // work held at least kBusyHostFraction of the CPUs, or steal took at least
  // kBusyHostSteal of them.
  bool busy() const;
};
inline constexpr double kBusyHostFraction = 0.25;
inline constexpr double kBusyHostSteal = 0.05;

// A sample of the host's counters, taken at the start of a run; host_load_since
// turns it into the run's HostLoad at its end.
struct HostSample {
  double wall = 0, busy_s = 0, steal_s = 0, total_s = 0, own_cpu_s = 0, load_avg = -1;
  int cpus = 0;
  bool stat_ok = false;
};
HostSample sample_host();
HostLoad host_load_since(const HostSample& start);
nlohmann::json host_load_to_json(const HostLoad& h);

// The attention kernels a timed point ran (the variants of its time's
// "attention_forward:*" and "attention_backward:*" kernel calls: "cudnn",
// "scalar", "tensor_core", "naive", "cpu"), sorted; empty where none was counted.
std::set<std::string> attention_variants(const SweepPoint& p);
// The same for people: "cudnn" where both directions ran it, else by direction,
// "forward cudnn, backward scalar"; "" where none was counted.
std::string attention_kernels_label(const SweepPoint& p);
// The same from kernel calls by name (TimeStats::kernel_calls, kernel_calls_per_run).
std::string attention_kernels_label(const std::map<std::string, double>& kernel_calls);
// Why a timed point's attention did not run the kernels it asked for (its time's
// kernel_fallbacks): "cudnn asked: segment masks (packing) take the own kernels",
// by direction where the directions differ ("forward cudnn asked: ...; backward
// ..."); "" where every call ran what it asked for.
std::string attention_fallbacks_label(const SweepPoint& p);

struct Results {
  std::string schema = kResultsSchema;
  std::string run_time_utc;  // ISO 8601, "2025-01-31T12:00:00Z": when the run started
  double duration_s = 0;
  std::string preset;   // "quick" | "full"
  std::string backend;  // "cpu" | "cuda": the backend the run used
  uint64_t seed = 0;
  std::string only;     // the --only filter, empty when none
  std::string skip;     // the --skip filter, empty when none
  std::vector<int> dp_ranks;  // --ranks, empty when not given (the default: 2 and 4)
  // A CUDA run's memory-efficient attention kernels for fp16 and bf16
  // (ops::gpu_attention_kernel_name: "scalar", "tensor_core" or "cudnn"); empty on the
  // CPU and in files written before it was recorded.
  std::string attention_kernel;
  nlohmann::json device = nlohmann::json::object();  // DeviceRecord (kept as JSON: a
                                                     // loaded file may come from another build)
  nlohmann::json build = nlohmann::json::object();   // build_record()
  std::vector<Measurement> measurements;
  std::vector<SweepPoint> sweep_points;
  std::vector<SpecTiming> timings;
  // An interrupted run (SIGINT / SIGTERM) keeps what finished: `incomplete` is set
  // and not_run names the properties and sweeps that did not run, in order;
  // `headroom run --resume DIR` runs them. A complete run writes neither field.
  bool incomplete = false;
  std::vector<std::string> not_run;
  std::optional<HostLoad> host;  // absent in files written before it was recorded
  RunTotals totals;
};

// What kind of run a results file holds, for the first line of its report and
// summary: "interrupted" (incomplete), "with errors" (a property threw or a sweep
// point ended in error), "empty" (nothing measured: no measurement and no ok sweep
// point), "partial" (an --only or --skip selection), else "complete" (which may still
// hold specs skipped here: RunTotals::specs_skipped, e.g. GPU-only ones on a CPU).
std::string run_kind(const Results& r);

// Recounts r.totals from the measurements and sweep points.
void compute_totals(Results& r);

// The build record of this binary: git SHA, version, compilers, CUDA archs, build type.
nlohmann::json build_record();

// "YYYY-MM-DDTHH:MM:SSZ" for the current time.
std::string utc_now_iso8601();

// Whether a measurement stands for a property that threw (see make_error_measurement).
bool is_error_measurement(const Measurement& m);
// The measurement recorded when a property throws: passed = false, error NaN,
// metric "exception", the reason in details.error.
Measurement make_error_measurement(const std::string& id, const std::string& title,
                                   const std::string& backend, const std::string& reason);

nlohmann::json results_to_json(const Results& r);
// Validates the schema and the fields it reads; throws InvalidArgument naming the
// problem (`what` names the source in messages, e.g. the file path).
Results results_from_json(const nlohmann::json& j, const std::string& what = "results");

Measurement measurement_from_json(const nlohmann::json& j);
SweepPoint sweep_point_from_json(const nlohmann::json& j);

// Replaces every non-finite floating value in j, at any depth, by the strings
// "nan" / "inf" / "-inf" (json_number), so nothing is written as null.
void make_non_finite_explicit(nlohmann::json& j);

// Written through write_output (harness/output.hpp).
void save_results(const Results& r, const std::string& path);

// The limits on what headroom reads: a file larger than max_bytes or nested deeper
// than kMaxJsonDepth is refused before it is parsed (a deep nesting would exhaust
// the stack of a recursive reader or destructor).
inline constexpr size_t kMaxJsonDepth = 64;
inline constexpr size_t kMaxResultsBytes = size_t{1} << 30;  // 1 GiB
inline constexpr size_t kMaxConfigBytes = size_t{1} << 20;   // 1 MiB

// Reads path as one strict JSON document: no trailing text, no key twice in one
// object, nested at most kMaxJsonDepth deep. `what` names the file in messages
// ("results file", "step configuration"). Throws InvalidArgument naming the path:
// missing, a directory, unreadable, too large, or bad JSON (with the offset).
nlohmann::json read_json_file(const std::string& path, const std::string& what, size_t max_bytes);
// The same for text already in memory (`where` names its source in messages).
nlohmann::json parse_json_strict(const std::string& text, const std::string& where);

// Refuses (InvalidArgument) an output that is the same file as an input: files
// are compared by identity (device and inode, through links), not by name. An
// output that does not exist yet is no input. `output_role` and each input's role
// name the options in the message, e.g. "--html" and "--baseline".
void refuse_output_over_input(const std::string& output, const std::string& output_role,
                              const std::vector<std::pair<std::string, std::string>>& inputs);

// Whether a stored verdict agrees with the one recomputed from error and tolerance
// (make_check, make_negative_control, make_subtle_control): a check passes when
// error <= tolerance, a control is caught when finite and above it (a subtle one
// within tol::kSubtleControlMaxPower times it); a NaN error never passes.
bool recomputed_verdict(const Measurement& m);
// Reads and validates a results file; throws InvalidArgument for a missing or
// unreadable file, bad JSON or another schema.
Results load_results(const std::string& path);

}  // namespace hr
