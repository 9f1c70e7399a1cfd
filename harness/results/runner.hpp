// Runs the registered properties and sweeps of a preset on one Device and collects
// what they return into Results. A property or sweep that throws becomes an error
// record and the run goes on. Progress (what runs, n of N, elapsed, expected time
// left) goes to a stream, normally stderr.
#pragma once

#include <csignal>
#include <cstdint>
#include <functional>
#include <map>
#include <ostream>
#include <string>

#include "harness/device.hpp"
#include "harness/registry.hpp"
#include "harness/results/results.hpp"

namespace hr {

struct RunOptions {
  Preset preset = Preset::quick;
  std::string only;  // ECMAScript regex searched in each spec's id and title; empty = all
  std::string skip;  // the same, for specs left out even when `only` selects them; empty = none
  uint64_t seed = 1234;
  std::vector<int> dp_ranks;  // recorded in Results (the launcher reads dist::dp_rank_counts)
  // Set (by a signal handler) to stop the run between two properties or sweeps:
  // what finished is kept, Results::incomplete set and the rest listed in not_run.
  const volatile std::sig_atomic_t* stop = nullptr;
  // A run to resume (`run --resume`): the properties and sweeps it finished are
  // taken from it as they are, in their place in the order; only the rest run.
  const Results* resume = nullptr;
  // Called after each property or sweep with what has finished so far (marked
  // incomplete, the rest in not_run), e.g. to write it: a run killed outright
  // (SIGKILL, power) then loses only what was running and can be resumed.
  std::function<void(const Results&)> checkpoint;
  // Asked after each property or sweep (its id): whether the device can no longer
  // be used by this process (a sticky CUDA error). When it says so (with why), the
  // run stops there as if interrupted, the rest listed in not_run, and
  // *device_lost holds "ID: why" so that the caller can go on in a fresh process.
  std::function<bool(const std::string& id, std::string* why)> device_check;
  std::string* device_lost = nullptr;
  // While a property or sweep runs, a progress line after this many seconds in
  // which nothing was said ("GA-3 still running (45s)").
  double heartbeat_s = 15;
};

// The registered specs the options select, in registration order (properties
// first, then sweeps). Throws InvalidArgument for a bad regex.
struct Selection {
  std::vector<const PropertySpec*> properties;
  std::vector<const SweepSpec*> sweeps;
  size_t size() const { return properties.size() + sweeps.size(); }
};
Selection select_specs(const RunOptions& opt);

// What a resumed run keeps of `old`: each property or sweep that finished there,
// keyed "property:ID" or "sweep:ID", with its timing and its items (cut from the
// file's measurements and sweep points by the counts of its timings, which are in
// run order). One that was skipped there (it said why, or a sweep all of whose
// points were skipped) did not finish: the resumed run tries it again, so that a
// run resumed where mpirun is now present fills in its data-parallel entries.
// Throws InvalidArgument where the timings do not account for the file's items.
struct FinishedSpec {
  SpecTiming timing;
  std::vector<Measurement> measurements;
  std::vector<SweepPoint> points;
};
std::map<std::string, FinishedSpec> finished_specs(const Results& old);

// Runs the selection on dev. progress may be null.
Results run_suite(Device& dev, const RunOptions& opt, std::ostream* progress);

// "1:05" / "12s": short durations for progress lines.
std::string format_duration(double seconds);

// What each property or sweep is expected to take at a preset on a backend: the
// seconds it took in the runs harness/results/measured_costs.inc was made from
// (ci/measured-costs), or, for one those runs lack, its expected_seconds_quick
// scaled by how the measured ones compare with theirs. `calibrated`: such runs
// exist for this preset and backend; otherwise the costs are the quick preset's
// on a 2-core CPU, good for the shares of the work only.
struct ExpectedCosts {
  bool calibrated = false;
  double seconds(const std::string& kind, const std::string& id, double expected_seconds_quick) const;
  Preset preset = Preset::quick;
  BackendKind backend = BackendKind::cpu;
  double scale = 1.0;  // measured / expected_seconds_quick over the specs measured
};
ExpectedCosts expected_costs(Preset preset, BackendKind backend);

}  // namespace hr
