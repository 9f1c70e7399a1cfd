// Timing statistics, the timed loop, and the slowdown injection that lets a test
// show that a comparison catches a real regression.
#include "harness/timing.hpp"

#include <cblas.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <sstream>
#include <thread>

#include <time.h>

#include "harness/check.hpp"
#include "harness/kernel_calls.hpp"
#include "harness/op_profile.hpp"

namespace hr {

namespace {
double quantile(const std::vector<double>& sorted, double q) {
  if (sorted.empty()) return 0;
  const double pos = q * static_cast<double>(sorted.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(pos)), hi = static_cast<size_t>(std::ceil(pos));
  return sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - static_cast<double>(lo));
}
}  // namespace

// A timed region runs on this thread alone (one BLAS thread, see time_region); the
// process's clock would also count OpenBLAS's pool workers, which spin for a while
// after a product on more threads: after one such product (a fleet rank's set-up),
// four repetitions of a 10.4 ms single-threaded product each took 20.8 ms of
// process CPU time.
double thread_cpu_seconds() {
  timespec ts{};
  HR_CHECK(clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) == 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID) failed");
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// The operands (96 + 48 + 32 KiB, about 320 KiB with OpenBLAS's packed copies)
// stay in a core's own L2 cache (512 KiB or more on server cores since 2017) across
// the products, so the reference follows the core's speed (clocks, a busy sibling
// hyperthread) and not the last-level cache that other tenants share. A reference
// that streams from the shared L3 moves with their traffic in stretches the step
// does not share: 8 products 2048x192 by 192x64 (a 1.5 MiB operand; 2-vCPU EPYC VM,
// 1 MiB L2, 32 MiB L3) took 4.3 ms or 4.7-5.1 ms and moved BM-MB's ratios by up to
// 10.7% over six processes of one build where the CPU time alone moved 5.1%; these
// products took 4.17-4.24 ms at every point of eight processes.
namespace {
constexpr int kRefM = 128, kRefK = 192, kRefN = 64, kRefProducts = 128;
}  // namespace

std::string reference_work_name() {
  return fmt::format("sgemm {}x{} by {}x{}, {} products; {}", kRefM, kRefK, kRefK, kRefN, kRefProducts,
                     openblas_get_config());
}

double reference_work_cpu_seconds() {
  // Fixed, non-trivial operands (values in [-1, 1]); built once.
  static const std::vector<float> a = [] {
    std::vector<float> v(static_cast<size_t>(kRefM) * kRefK);
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(std::sin(0.37 * static_cast<double>(i) + 0.1));
    return v;
  }();
  static const std::vector<float> b = [] {
    std::vector<float> v(static_cast<size_t>(kRefK) * kRefN);
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(std::cos(0.53 * static_cast<double>(i) + 0.2));
    return v;
  }();
  thread_local std::vector<float> c(static_cast<size_t>(kRefM) * kRefN);
  const double cpu0 = thread_cpu_seconds();
  for (int i = 0; i < kRefProducts; ++i)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, kRefM, kRefN, kRefK, 1.0f, a.data(), kRefK, b.data(),
                kRefN, 0.0f, c.data(), kRefN);
  return thread_cpu_seconds() - cpu0;
}

TimeStats summarize_times(std::vector<double> samples) {
  TimeStats t;
  t.reps = static_cast<int>(samples.size());
  t.samples_s = samples;
  if (samples.empty()) return t;
  std::sort(samples.begin(), samples.end());
  t.median_s = quantile(samples, 0.5);
  t.min_s = samples.front();
  t.max_s = samples.back();
  t.mean_s = std::accumulate(samples.begin(), samples.end(), 0.0) / static_cast<double>(samples.size());
  double var = 0;
  for (double s : samples) var += (s - t.mean_s) * (s - t.mean_s);
  t.stddev_s = samples.size() > 1 ? std::sqrt(var / static_cast<double>(samples.size() - 1)) : 0.0;
  std::vector<double> dev;
  for (double s : samples) dev.push_back(std::fabs(s - t.median_s));
  std::sort(dev.begin(), dev.end());
  t.mad_s = quantile(dev, 0.5);
  t.rel_spread = t.median_s > 0 ? (quantile(samples, 0.9) - quantile(samples, 0.1)) / t.median_s : 0.0;
  t.noisy = t.rel_spread > kNoisyRelSpread;
  return t;
}

TimeStats time_region(Device& dev, const std::function<void()>& fn, const TimingOptions& opt) {
  HR_ARG_CHECK(opt.min_reps >= 1 && opt.max_reps >= opt.min_reps, "bad timing repetitions {}..{}",
               opt.min_reps, opt.max_reps);
  for (int i = 0; i < opt.warmup; ++i) fn();
  dev.synchronize();
  HR_ARG_CHECK(opt.injected_slowdown >= 1.0 && std::isfinite(opt.injected_slowdown),
               "an injected slowdown must be a finite factor >= 1, got {}", opt.injected_slowdown);
  const double wait_factor = opt.injected_slowdown - 1.0;
  const bool on_host = dev.kind() == BackendKind::cpu;
  // The calling thread's clock sees all of the region's work only when BLAS runs on
  // this thread alone (props::time_point holds one BLAS thread).
  HR_ARG_CHECK(!on_host || openblas_get_num_threads() == 1,
               "time_region on the CPU needs BLAS on one thread (it has {}): the region is timed by its thread's CPU "
               "time", openblas_get_num_threads());
  auto timer = dev.make_timer();
  // The run's own time inside a slowed repetition: its device time on a GPU (the
  // host's clock would add the launch and the synchronisation).
  auto run_timer = wait_factor > 0 && !on_host ? dev.make_timer() : nullptr;
  std::vector<double> samples, cpu_samples, ref_cpu_samples;
  int capped = 0;  // slowed repetitions whose spin reached its wall-clock cap
  double total = 0;
  const KernelCalls calls0 = kernel_calls();
  const KernelFallbacks fallbacks0 = kernel_fallbacks();
  while (static_cast<int>(samples.size()) < opt.max_reps &&
         (static_cast<int>(samples.size()) < opt.min_reps || total < opt.min_total_s)) {
    const double cpu0 = on_host ? thread_cpu_seconds() : 0.0;
    timer->start();
    const auto host0 = std::chrono::steady_clock::now();
    if (run_timer) run_timer->start();
    fn();
    if (wait_factor > 0) {
      // The injected factor as a wait of (factor - 1) times this run's own time,
      // inside the timed region, so that the repetition takes the factor times its
      // run whatever the run costs: a second run would find the caches warm and
      // cost less than the first.
      using Clock = std::chrono::steady_clock;
      auto span = [](double s) { return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s)); };
      if (on_host) {
        // The CPU: a spin for (factor - 1) times the run's CPU time, so that the
        // thread's CPU time (what validate judges there) grows by the factor, then a
        // sleep for what is left of (factor - 1) times its wall time. The spin gives
        // up ten waits past the wall-clock wait, which only a machine giving the
        // thread under a tenth of a core reaches; such repetitions are counted.
        const double run_wall = std::chrono::duration<double>(Clock::now() - host0).count();
        const double cpu_now = thread_cpu_seconds();
        const double cpu_until = cpu_now + (cpu_now - cpu0) * wait_factor;
        const auto until = Clock::now() + span(run_wall * wait_factor);
        const auto cap = until + span(10 * run_wall * wait_factor);
        while (thread_cpu_seconds() < cpu_until) {
          if (Clock::now() >= cap) {
            ++capped;
            break;
          }
        }
        std::this_thread::sleep_until(until);
      } else {
        // A GPU: the device idles for (factor - 1) times the run's device time, which
        // its event timer sees. The host sleeps to within 200 us of the end and spins
        // the rest (a sleep can end late by tens of microseconds); what the
        // synchronisation and the timer's stop add (microseconds) is not taken off.
        const double run_s = run_timer->stop_seconds();
        const auto until = Clock::now() + span(run_s * wait_factor);
        const auto near = until - span(200e-6);
        if (Clock::now() < near) std::this_thread::sleep_until(near);
        while (Clock::now() < until) {
        }
      }
    }
    const double s = timer->stop_seconds();
    if (on_host) cpu_samples.push_back(thread_cpu_seconds() - cpu0);
    // The machine's speed right after the repetition, outside the timed region.
    if (on_host && opt.reference_work) ref_cpu_samples.push_back(reference_work_cpu_seconds());
    samples.push_back(s);
    total += s;
  }
  if (capped > 0)
    std::fprintf(stderr,
                 "headroom: an injected slowdown's wait gave up in %d of %zu repetitions, the thread given under a "
                 "tenth of a core: their CPU time grew by less than the factor %g\n",
                 capped, samples.size(), opt.injected_slowdown);
  const double runs = static_cast<double>(samples.size());
  TimeStats t = summarize_times(std::move(samples));
  t.kernel_calls = kernel_calls_per_run(calls0, kernel_calls(), runs);
  t.kernel_fallbacks = kernel_fallbacks_between(fallbacks0, kernel_fallbacks());
  // Where the region's time goes: one more run under an op profile, after the
  // counts above and outside the samples (its events cost time of their own).
  if (op_profile_requested() && !OpProfile::active()) {
    t.extra_runs = 1;
    try {
      OpProfile profile;
      fn();
      t.op_seconds = profile.take();
    } catch (const std::exception& e) {  // the timed samples stand without it
      std::fprintf(stderr, "headroom: the op profile of a timed region failed, kept without it: %s\n", e.what());
    }
  }
  t.cpu_samples_s = std::move(cpu_samples);
  t.ref_cpu_samples_s = std::move(ref_cpu_samples);
  if (!t.ref_cpu_samples_s.empty()) t.ref_work = reference_work_name();
  return t;
}

void to_json(nlohmann::json& j, const TimeStats& t) {
  j = nlohmann::json{{"reps", t.reps},         {"median_s", t.median_s}, {"mean_s", t.mean_s},
                     {"min_s", t.min_s},       {"max_s", t.max_s},       {"stddev_s", t.stddev_s},
                     {"mad_s", t.mad_s},       {"rel_spread", t.rel_spread}, {"noisy", t.noisy},
                     {"samples_s", t.samples_s}};
  if (!t.cpu_samples_s.empty()) j["cpu_samples_s"] = t.cpu_samples_s;
  if (!t.ref_cpu_samples_s.empty()) j["ref_cpu_samples_s"] = t.ref_cpu_samples_s;
  if (!t.ref_work.empty()) j["ref_work"] = t.ref_work;
  if (!t.kernel_calls.empty()) j["kernel_calls"] = t.kernel_calls;
  if (!t.kernel_fallbacks.empty()) j["kernel_fallbacks"] = t.kernel_fallbacks;
  if (!t.op_seconds.empty()) j["op_seconds"] = t.op_seconds;
}

double injected_slowdown(const std::string& spec, const std::string& sweep, const nlohmann::json& config) {
  std::stringstream entries(spec);
  std::string entry;
  while (std::getline(entries, entry, ';')) {
    if (entry.empty()) continue;
    // SWEEP[:KEY=VALUE[,KEY=VALUE...]]:FACTOR
    const auto first = entry.find(':'), last = entry.rfind(':');
    HR_ARG_CHECK(first != std::string::npos, "{}: '{}' is not SWEEP[:KEY=VALUE,...]:FACTOR", kInjectSlowdownEnv,
                 entry);
    const std::string name = entry.substr(0, first);
    const std::string conditions = first == last ? "" : entry.substr(first + 1, last - first - 1);
    const std::string factor_text = entry.substr(last + 1);
    char* end = nullptr;
    const double factor = std::strtod(factor_text.c_str(), &end);
    HR_ARG_CHECK(!factor_text.empty() && end != nullptr && *end == '\0' && std::isfinite(factor) && factor >= 1.0,
                 "{}: the factor of '{}' must be a number >= 1, got '{}'", kInjectSlowdownEnv, entry, factor_text);
    if (name != sweep) continue;
    bool all = true;
    std::stringstream conds(conditions);
    std::string cond;
    while (all && std::getline(conds, cond, ',')) {
      const auto eq = cond.find('=');
      HR_ARG_CHECK(eq != std::string::npos && eq > 0, "{}: '{}' in '{}' is not KEY=VALUE", kInjectSlowdownEnv, cond,
                   entry);
      const std::string key = cond.substr(0, eq), value = cond.substr(eq + 1);
      auto it = config.is_object() ? config.find(key) : config.end();
      all = config.is_object() && it != config.end() &&
            (it->is_string() ? it->get<std::string>() == value : it->dump() == value);
    }
    if (all) return factor;
  }
  return 1.0;
}

void apply_injected_slowdown(const std::string& sweep, const nlohmann::json& config, TimingOptions& opt,
                             nlohmann::json& metrics) {
  opt.injected_slowdown = injected_slowdown(sweep, config);
  if (opt.injected_slowdown != 1.0) metrics["injected_slowdown"] = opt.injected_slowdown;
}

double injected_slowdown(const std::string& sweep, const nlohmann::json& config) {
  const char* spec = std::getenv(kInjectSlowdownEnv);
  return spec == nullptr ? 1.0 : injected_slowdown(spec, sweep, config);
}

}  // namespace hr
