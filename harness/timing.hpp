// Timing a region on a Device: warm-up runs first, then repetitions each timed on
// its own (CUDA events on the GPU, a steady clock on the CPU), summarised by the
// median and the spread, with the samples kept so that a comparison can test two
// runs' samples against each other. On the CPU each repetition's CPU time (of the
// timing thread, which does all of the region's work: BLAS on one thread) is kept
// too: other work on a shared machine stretches the wall clock by however
// much of the cores it takes, but not the CPU time the work itself needs. That CPU
// time still moves with the machine's state (a busy sibling hyperthread, clocks):
// on request a fixed reference work (OpenBLAS products on fixed buffers, no
// headroom code) runs after each repetition, so a comparison can judge the ratio.
// A result whose spread is too large says so.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "harness/device.hpp"

namespace hr {

struct TimeStats {
  int reps = 0;
  double median_s = 0, mean_s = 0, min_s = 0, max_s = 0;
  double stddev_s = 0;
  double mad_s = 0;           // median absolute deviation
  double rel_spread = 0;      // (p90 - p10) / median; noise measure used by comparisons
  bool noisy = false;         // rel_spread above kNoisyRelSpread
  std::vector<double> samples_s;  // every repetition, in the order timed (results.json "samples_s")
  // CPU backend: the timing thread's CPU time (user + system) of each repetition,
  // in the same order (results.json "cpu_samples_s"); empty on a GPU.
  std::vector<double> cpu_samples_s;
  // CPU backend with TimingOptions::reference_work: the CPU time of the reference
  // work run right after each repetition, in the same order (results.json
  // "ref_cpu_samples_s"); the machine's speed at that moment.
  std::vector<double> ref_cpu_samples_s;
  // Which reference work those samples are of (reference_work_name(); results.json
  // "ref_work"); empty in files written before it was named, whose reference was
  // another (8 products 2048x192 by 192x64).
  std::string ref_work;
  // The kernels the region ran, counted by kernel_calls.hpp: calls per run of the
  // region, by name ("attention_forward:cudnn"; results.json "kernel_calls"). Only
  // the kernels counted there, and only those that ran; empty in files written
  // before they were recorded.
  std::map<std::string, double> kernel_calls;
  // The kernels the region asked for and did not run (a form that falls back call
  // by call), each with why: results.json "kernel_fallbacks", by the name asked
  // for ("attention_forward:cudnn": "segment masks (packing) take the own
  // kernels"). Empty where every call ran what it asked for.
  std::map<std::string, std::string> kernel_fallbacks;
  // With HEADROOM_OP_PROFILE=1 (harness/op_profile.hpp): the device seconds of each
  // op in one more run of the region, after the timed ones and outside them
  // (results.json "op_seconds"); empty otherwise.
  std::map<std::string, double> op_seconds;
  // Runs of the region beyond warm-up and the timed ones: 1 when it was profiled
  // (a caller that counts what its region did per run subtracts it); not written.
  int extra_runs = 0;
};
void to_json(nlohmann::json& j, const TimeStats& t);

// Relative spread above which a timing is flagged as too noisy to compare.
inline constexpr double kNoisyRelSpread = 0.25;

TimeStats summarize_times(std::vector<double> samples_s);

// The fewest timed samples a point takes in a run, so that validate's rank test can
// judge it slower at all: the two-sided Mann-Whitney U test at p < 0.01 (compare's
// default --time-alpha), in its normal approximation with the continuity
// correction, needs 6 samples a side (5 against 5, every one apart, give 0.012 at
// best; 6 against 6, 0.005). A sweep timed fewer times would pass any slowdown as
// noisy.
inline constexpr int kMinJudgedReps = 6;

struct TimingOptions {
  int warmup = 2;
  int min_reps = kMinJudgedReps;
  int max_reps = 50;
  double min_total_s = 0.2;  // keep repeating (up to max_reps) until this much was timed
  // Fault injection for testing comparisons (see injected_slowdown): each timed
  // repetition takes this many times its own time. 1 = none.
  double injected_slowdown = 1.0;
  // CPU backend: run the reference work (reference_work_cpu_seconds) after each
  // repetition, outside the timed region, and keep its CPU time.
  bool reference_work = false;
};

// The calling thread's CPU time, in seconds (CLOCK_THREAD_CPUTIME_ID): the clock
// time_region times a CPU region by.
double thread_cpu_seconds();

// Runs the fixed reference work once (128 single-precision products 128x192 by
// 192x64 through CBLAS on fixed buffers of 176 KiB, ~4 ms on one 2020s core,
// on the BLAS threads as set: one inside time_region) and returns the calling
// thread's CPU time it took.
double reference_work_cpu_seconds();

// What that work is, as results.json records it beside the reference samples
// ("ref_work"): the products' shapes and count, and the BLAS that ran them (its
// version and the kernels it chose for this core, openblas_get_config()). A
// comparison divides by the reference only where both runs name the same work.
std::string reference_work_name();

// Times fn() on `dev`; fn must enqueue all its work on the device's stream. On the
// CPU, BLAS must run on one thread (props::OneBlasThread; InvalidArgument if not).
TimeStats time_region(Device& dev, const std::function<void()>& fn, const TimingOptions& opt = {});

// The environment variable that injects a real slowdown into chosen sweep points,
// so that `headroom validate` can be shown to catch one:
//   HEADROOM_INJECT_SLOWDOWN='SWEEP[:KEY=VALUE[,KEY=VALUE...]]:FACTOR[;...]'
// e.g. 'BM-MB:micro_batch=4:2' makes each repetition of micro-batch 4's timed
// region take twice its run: the region runs once and then waits FACTOR - 1 times
// that run's own time (on the CPU the wait spins for that much CPU time first, so
// that the CPU time grows by the factor as well as the wall clock). A second run
// would not do: it finds the caches warm, and on a loaded 2-core host a region
// run 4 times per repetition timed at 2.3-2.9 times one run. The point records the
// factor in its metrics ("injected_slowdown").
inline constexpr const char* kInjectSlowdownEnv = "HEADROOM_INJECT_SLOWDOWN";

// The factor HEADROOM_INJECT_SLOWDOWN asks for the point (sweep, config): the
// first entry whose sweep matches and whose every KEY=VALUE equals the config's
// value (numbers as JSON writes them, strings unquoted); 1 when none matches or the
// variable is unset. A malformed value throws InvalidArgument.
double injected_slowdown(const std::string& sweep, const nlohmann::json& config);
// The same for a given specification string (the variable's value), for tests.
double injected_slowdown(const std::string& spec, const std::string& sweep, const nlohmann::json& config);
// Sets opt.injected_slowdown for the point (sweep, config) and, when it is not 1,
// records it in the point's metrics ("injected_slowdown").
void apply_injected_slowdown(const std::string& sweep, const nlohmann::json& config, TimingOptions& opt,
                             nlohmann::json& metrics);

}  // namespace hr
