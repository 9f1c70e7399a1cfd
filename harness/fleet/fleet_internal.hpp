// What the fleet's rank side and its driver share (not for other callers).
#pragma once

#include <string>

#include "harness/fleet/fleet.hpp"

namespace hr::fleet {

// A rank's files in the fleet's folder: its final record, its work record while the
// level runs (the phase it is in), and its log.
std::string rank_file(const std::string& dir, int rank);
std::string work_file(const std::string& dir, int rank);
std::string log_file(const std::string& dir, int rank);

// The ranks' barriers are files: .<what>_<rank> in the folder. wait_markers waits
// for those of ranks [first, end) and says whether they all came within timeout_s.
void touch_marker(const std::string& dir, const char* what, int rank);
bool wait_markers(const std::string& dir, const char* what, int first, int end, double timeout_s);

// A rank's throughputs are timed in kThroughputRounds rounds of
// kThroughputRepsPerRound repetitions each (the fastest counts); timed_marker(k)
// names the barrier of round k.
inline constexpr int kThroughputRounds = 3;
inline constexpr int kThroughputRepsPerRound = 4;
inline std::string timed_marker(int round) { return "timed_r" + std::to_string(round); }

}  // namespace hr::fleet
