// What the fleet's rank side and its driver share (not for other callers).
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "harness/fleet/fleet.hpp"

namespace hr::fleet {

// A rank's files in the fleet's folder: its final record, its work record while the
// level runs (the phase it is in), and its log.
std::string rank_file(const std::string& dir, int rank);
std::string work_file(const std::string& dir, int rank);
std::string log_file(const std::string& dir, int rank);

// The ranks' barriers are files: .<what>_<rank> in the folder (marker_path; a
// decision's marker holds the decision). wait_markers waits for those of the ranks
// listed and says whether they all came within timeout_s.
std::string marker_path(const std::string& dir, const std::string& what, int rank);
void touch_marker(const std::string& dir, const char* what, int rank);
bool wait_markers(const std::string& dir, const char* what, const std::vector<int>& ranks, double timeout_s);

// A rank's throughputs are timed in rounds of kThroughputRepsPerRound repetitions
// each; a round's value is its fastest repetition, and the rank's throughput is the
// median of its rounds' values (round_median); timed_marker(k) names the barrier of
// round k. CPU ranks take turns in every round, GPUs are timed together. After
// kThroughputRounds rounds, and after each round more, the lowest live rank reads
// every rank's record and decides for all (in .decide_r<k>_<rank>): if any rank's
// median lies behind the fastest other's by more than behind_floor after the first
// rounds, and then while one lies behind it by more than the slow floor, every
// rank is timed one round more, up to kConfirmRounds more, within the lesser of
// 120 s and 15% of the budget and never past 75% of it. A slow spell of a shared
// host slows whoever it meets, and passes: the rounds more give a rank that met
// one (or the others, whose median it is judged by) more rounds outside one. A slow
// device stays slow in every round.
inline constexpr int kThroughputRounds = 3;
inline constexpr int kConfirmRounds = 12;
inline constexpr int kThroughputRepsPerRound = 2;
inline std::string timed_marker(int round) { return "timed_r" + std::to_string(round); }

// The throughputs a device is judged by, in its record's "throughput".
struct Metric {
  const char* key;   // in the rank's "throughput"
  const char* name;  // for people
  const char* unit;
  bool judged_on_cpu;
};
// CPU ranks standing in for devices share one machine's memory: their copy
// bandwidth is the machine's, measured once per rank, recorded and not judged
// (it moved by up to 14% between identical ranks on the 2-core CI machine).
inline constexpr Metric kMetrics[] = {{"step", "training step", "tokens/s", true},
                                      {"gemm", "matrix product", "TFLOP/s", true},
                                      {"copy", "device copy", "GB/s", false}};
inline bool judged(const Metric& m, BackendKind backend) { return backend == BackendKind::cuda || m.judged_on_cpu; }

// Devices are compared with those of the same kind (backend, name, SM count, driver
// and build) only.
std::string kind_of(const nlohmann::json& rec);

// The slow floor of a kind of device (harness/tolerances.hpp kFleetSlowFloor*).
double slow_floor(BackendKind backend);
// How far behind the fastest other rank a rank's median must lie after the first
// rounds for every rank to be timed rounds more (harness/tolerances.hpp
// kFleetBehind*); the rounds more go on while one lies behind by the slow floor.
double behind_floor(BackendKind backend);

// The median of the values (the mean of the middle two of an even count); NaN when
// there are none.
double median_of(std::vector<double> v);

// A throughput's value from its rounds' values: their median. Not the fastest
// round: on a shared host the speed is not "the device's, less interference" but
// moves both ways (fast spells too). In 32 four-rank fleets of CPU ranks on the
// 2-core CI machine, an identical rank read up to 24% below the others' median by
// its fastest round and up to 14% by the median of its rounds; in 7 fleets with a
// rank slowed 1.25x, it read from 2% above to 29% below by its fastest round (under
// the 15% floor in 3) and 15-28% below by its median. On a GPU the median also sees a device that
// slows as it warms, which its fastest round would hide.
double round_median(const nlohmann::json& round_values);

// Folds one round's point of a throughput ({"status", "value", ...}) into those so
// far (`t`, null before the first): "round_values" every round's value, "value"
// their median, "fastest_round" the fastest round's point; a round that did not
// measure (status not "ok") is the result from then on: its status and reason, a
// value of 0, and its point under "failed_round".
void fold_round(nlohmann::json& t, nlohmann::json p);

}  // namespace hr::fleet
