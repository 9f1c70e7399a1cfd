// What the sweeps share. Every sweep point is measured the same way: its identity
// (sweep_point), out of memory recorded as its status (measure_point), and either
// a timed region (time_point: the peak reset, the region timed, the snapshot, and
// one record of the settings it ran under) or an untimed one for byte counts
// (peak_point). BM-DP alone times with a clock of its own: collectives need the same
// repetition count on every rank, and each sample is the slowest rank's. The sweeps that fit a scaling exponent (CK-3 against depth, PK-4
// and BM-SEQ against sequence length) share the log-log fit of one series, written
// into each of its points, and the last run's points, kept so that the property
// judging the exponents and the sweep drawing them measure once.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "harness/dtype.hpp"
#include "harness/fit.hpp"
#include "harness/registry.hpp"
#include "harness/timing.hpp"

namespace hr::props {

// On the CPU, the timed steps of a point run BLAS on one thread. With two threads
// on a machine shared with other work, each product waits for whichever thread is
// descheduled: on a 2-core machine under a load of ~8 the same quick step took a
// median of 0.25-1.4 s of wall clock, and a run of the sweep 9.6-23 s of CPU time
// (one thread: 0.28-0.37 s, 8.7-9.2 s), too unsteady for any comparison. These
// products are small, so one thread costs little when the machine is idle.
class OneBlasThread {
 public:
  explicit OneBlasThread(const Device& dev);
  ~OneBlasThread();
  OneBlasThread(const OneBlasThread&) = delete;
  OneBlasThread& operator=(const OneBlasThread&) = delete;

 private:
  bool active_;
  int saved_ = 1;
};


// A point of `sweep` on dev in dtype, of `model`, with its configuration: the
// fields every point carries (status "ok" until measure_point says otherwise).
SweepPoint sweep_point(const std::string& sweep, const Device& dev, DType dtype, const std::string& model,
                       nlohmann::json config);

// Runs measure(); an OutOfMemory from it (the budget's or the device's) becomes the
// point's status "out_of_memory" with the reason, and the sweep goes on.
void measure_point(SweepPoint& p, const std::function<void()>& measure);

// The timed part of a point, the same in every timed sweep. The caller has built
// what it times and run it once (first-touch allocations and optimizer state out of
// the region). Then: the device synchronized and the peak reset; `region` timed by
// time_region under `timing`, with the reference work tracked on the CPU
// (timing.hpp) and the slowdown HEADROOM_INJECT_SLOWDOWN asks for this point applied;
// BLAS on one thread on the CPU for the region (OneBlasThread); p.time and p.memory
// (the peaks of the timed repetitions) set; and the settings recorded in p.metrics:
// "noisy", "blas_threads" (on the CPU, the BLAS's thread count during the region),
// "injected_slowdown" (when not 1). Returns the snapshot taken before the region.
MemorySnapshot time_point(Device& dev, SweepPoint& p, TimingOptions timing, const std::function<void()>& region);

// The untimed counterpart, for sweeps that read bytes only (CK-3, PK-4): the device
// synchronized and the peak reset, `region` run once and synchronized, p.memory set,
// and the bytes recorded: "activation_peak_bytes", "pass_peak_bytes" (the peak over
// what was held before the region) and "total_peak_bytes". Returns the snapshot
// taken before the region.
MemorySnapshot peak_point(Device& dev, SweepPoint& p, const std::function<void()>& region);

// The byte metrics of a point from its p.memory and the snapshot before its region:
// "activation_peak_bytes", "pass_peak_bytes" and "total_peak_bytes".
void record_peak_bytes(SweepPoint& p, const MemorySnapshot& before);

// Fits metrics[y_metric] against config[x_key] over the ok points of
// points[first, end) and writes metrics[exponent_key] (and exponent_key + "_r2")
// into each of them. nullopt (nothing written) with fewer than two ok points.
std::optional<PowerFit> fit_series(std::vector<SweepPoint>& points, size_t first, const std::string& x_key,
                                   const std::string& y_metric, const std::string& exponent_key);

// A series measured apart from the sweep (a control's faulted run): fits it as
// fit_series does and returns the exponent (NaN when no point is ok), with the
// points in *points ({x_key, value_key} each, or the status of one that did not run).
double fitted_exponent(std::vector<SweepPoint> series, const std::string& x_key, const std::string& value_key,
                       const std::string& exponent_key, nlohmann::json* points);

// The points `measure` returns for (sweep, device, dtype, preset, seed), measured
// once per process for the last such key: byte counts are exact and do not depend
// on when they are taken, so the property and the sweep read the same points.
std::vector<SweepPoint> cached_points(const std::string& sweep, const Device& dev, DType dtype, Preset preset,
                                      uint64_t seed, const std::function<std::vector<SweepPoint>()>& measure);

}  // namespace hr::props
