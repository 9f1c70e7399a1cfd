// The suite runner behind `headroom run` and `headroom validate`.
#include "harness/results/runner.hpp"

#include <fmt/format.h>
#include <re2/re2.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <optional>
#include <map>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "harness/check.hpp"
#include "harness/step/train_step.hpp"
#include "kernels/attention/attention.hpp"

namespace hr {

namespace {

void note_sparse(Measurement& m, int64_t n) {
  m.details["sparse_micro_batches"] = n;
  m.details["sparse_micro_batches_note"] =
      fmt::format("language-model micro-batches with fewer than {} real targets among this property's steps",
                  kMinRealTargets);
}
void note_sparse(SweepPoint& p, int64_t n) { p.metrics["sparse_micro_batches"] = n; }

}  // namespace

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Expected time left: the remaining specs' expected_seconds_quick (measured for the
// quick preset on a 2-core CPU), scaled by how fast the run has been against them so
// far. Where they were measured (calibrated), the first spec alone is a poor guide:
// the observed ratio is blended with 1 until a few seconds have been observed.
// Elsewhere (the full preset, a GPU) they give the shares of the work only: no
// estimate until a spec has finished, then the observed ratio alone. Negative: none.
double expected_left(double observed_s, double expected_done_s, double expected_left_s, bool calibrated) {
  if (!calibrated) return expected_done_s > 0 && observed_s > 0 ? expected_left_s * observed_s / expected_done_s : -1;
  if (expected_done_s <= 0) return expected_left_s;
  const double ratio = observed_s / expected_done_s;
  const double weight = std::min(1.0, expected_done_s / 5.0);
  return expected_left_s * (weight * ratio + (1 - weight) * 1.0);
}

// A spec's outcome in a few words, as it ends: "12 checks passed, 8 of 8 controls
// caught", "1 of 12 checks FAILED", "8 points (2 out of memory)", and for a sweep
// whose run gives points of others too, "68 points: 20 DP-COMM, 48 DP-MEM".
std::string outcome(const std::vector<Measurement>& ms) {
  int checks = 0, failed = 0, controls = 0, missed = 0, errors = 0;
  for (const Measurement& m : ms) {
    if (m.metric == "error") ++errors;
    else if (m.negative_control) ++controls, missed += m.passed ? 0 : 1;
    else ++checks, failed += m.passed ? 0 : 1;
  }
  std::string s = failed > 0 ? fmt::format("{} of {} checks FAILED", failed, checks)
                             : fmt::format("{} check{} passed", checks, checks == 1 ? "" : "s");
  if (controls > 0)
    s += missed > 0 ? fmt::format(", {} of {} controls NOT caught", missed, controls)
                    : fmt::format(", {} of {} controls caught", controls, controls);
  if (errors > 0) s += fmt::format(", {} error{}", errors, errors == 1 ? "" : "s");
  return s;
}
std::string outcome(const std::vector<SweepPoint>& ps) {
  std::map<std::string, int> by, sweeps;
  for (const SweepPoint& p : ps) ++by[p.status], ++sweeps[p.sweep];
  std::string s = fmt::format("{} point{}", ps.size(), ps.size() == 1 ? "" : "s");
  std::string other;
  for (const auto& [status, n] : by)
    if (status != "ok") other += fmt::format("{}{} {}", other.empty() ? "" : ", ", n, status == "out_of_memory" ? "out of memory" : status);
  if (!other.empty()) s += " (" + other + ")";
  if (sweeps.size() > 1) {
    std::string each;
    for (const auto& [sweep, n] : sweeps) each += fmt::format("{}{} {}", each.empty() ? "" : ", ", n, sweep);
    s += ": " + each;
  }
  return s;
}

// While one spec runs: a line after every `every_s` seconds in which nothing was
// said, so a long item (TRADE, a seed sweep) shows it is alive and for how long.
class Heartbeat {
 public:
  Heartbeat(std::function<void(const std::string&)> say, std::mutex& mu, std::chrono::steady_clock::time_point& last,
            double every_s)
      : say_(std::move(say)), mu_(mu), last_(last), every_s_(every_s), thread_([this] { loop(); }) {}
  ~Heartbeat() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      done_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  // The spec now running (empty: none).
  void set(const std::string& id) {
    std::lock_guard<std::mutex> lk(mu_);
    id_ = id;
    since_ = std::chrono::steady_clock::now();
  }

 private:
  void loop() {
    std::unique_lock<std::mutex> lk(mu_);
    while (!done_) {
      cv_.wait_for(lk, std::chrono::milliseconds(250));
      const auto now = std::chrono::steady_clock::now();
      if (done_ || id_.empty() || std::chrono::duration<double>(now - last_).count() < every_s_) continue;
      const std::string line =
          fmt::format("headroom:        {} still running ({})", id_,
                      format_duration(std::chrono::duration<double>(now - since_).count()));
      lk.unlock();
      say_(line);
      lk.lock();
    }
  }
  std::function<void(const std::string&)> say_;
  std::mutex& mu_;
  std::chrono::steady_clock::time_point& last_;
  double every_s_;
  std::condition_variable cv_;
  bool done_ = false;
  std::string id_;
  std::chrono::steady_clock::time_point since_;
  std::thread thread_;
};

}  // namespace

namespace {

struct MeasuredCost {
  const char* kind;
  const char* id;
  const char* preset;
  const char* backend;
  double seconds;
};
constexpr MeasuredCost kMeasuredCosts[] = {
#include "harness/results/measured_costs.inc"
};

const MeasuredCost* measured(const std::string& kind, const std::string& id, Preset preset, BackendKind backend) {
  for (const MeasuredCost& c : kMeasuredCosts)
    if (kind == c.kind && id == c.id && std::string(preset_name(preset)) == c.preset &&
        std::string(backend_name(backend)) == c.backend)
      return &c;
  return nullptr;
}

}  // namespace

ExpectedCosts expected_costs(Preset preset, BackendKind backend) {
  ExpectedCosts e;
  e.preset = preset;
  e.backend = backend;
  double got = 0, expected = 0;
  for (const PropertySpec& p : property_registry())
    if (const MeasuredCost* c = measured("property", p.id, preset, backend)) got += c->seconds, expected += p.expected_seconds_quick;
  for (const SweepSpec& w : sweep_registry())
    if (const MeasuredCost* c = measured("sweep", w.id, preset, backend)) got += c->seconds, expected += w.expected_seconds_quick;
  e.calibrated = got > 0 && expected > 0;
  if (e.calibrated) e.scale = got / expected;
  return e;
}

double ExpectedCosts::seconds(const std::string& kind, const std::string& id, double expected_seconds_quick) const {
  if (const MeasuredCost* c = calibrated ? measured(kind, id, preset, backend) : nullptr) return c->seconds;
  return expected_seconds_quick * scale;
}

std::string format_duration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  if (s < 60) return fmt::format("{:.0f}s", s);
  const long t = std::lround(s);
  if (t < 3600) return fmt::format("{}:{:02d}", t / 60, t % 60);
  return fmt::format("{}:{:02d}:{:02d}", t / 3600, (t / 60) % 60, t % 60);
}

namespace {

// --only / --skip as a case-insensitive RE2 expression (the common syntax: '|',
// '^', '$', classes, groups, repetition; no backreferences); nullptr when empty.
// RE2 parses and matches without recursion, in time linear in the text, so no
// pattern can exhaust the stack or run away; its length is bounded all the same.
std::unique_ptr<re2::RE2> selection_regex(const char* option, const std::string& text) {
  constexpr size_t kMaxChars = 1000;
  HR_ARG_CHECK(text.size() <= kMaxChars, "{}: the regular expression is {} characters; at most {} are accepted",
               option, text.size(), kMaxChars);
  if (text.empty()) return nullptr;
  re2::RE2::Options o;
  o.set_case_sensitive(false);
  o.set_log_errors(false);
  auto re = std::make_unique<re2::RE2>(text, o);
  HR_ARG_CHECK(re->ok(), "{} '{}' is not a valid regular expression: {}", option, text, re->error());
  return re;
}

}  // namespace

Selection select_specs(const RunOptions& opt) {
  const std::unique_ptr<re2::RE2> only = selection_regex("--only", opt.only);
  const std::unique_ptr<re2::RE2> skip = selection_regex("--skip", opt.skip);
  auto matches = [](const std::unique_ptr<re2::RE2>& re, const std::string& id, const std::string& title) {
    return re2::RE2::PartialMatch(id, *re) || re2::RE2::PartialMatch(title, *re);
  };
  auto keep = [&](const std::string& id, const std::string& title) {
    return (!only || matches(only, id, title)) && !(skip && matches(skip, id, title));
  };
  Selection s;
  for (const auto& p : property_registry())
    if (keep(p.id, p.title)) s.properties.push_back(&p);
  for (const auto& w : sweep_registry())
    if (keep(w.id, w.title)) s.sweeps.push_back(&w);
  return s;
}

std::map<std::string, FinishedSpec> finished_specs(const Results& old) {
  std::map<std::string, FinishedSpec> finished;
  size_t mi = 0, pi = 0;
  for (const SpecTiming& t : old.timings) {
    FinishedSpec f{t, {}, {}};
    const size_t n = static_cast<size_t>(std::max(t.items, 0));
    if (t.kind == "property") {
      HR_ARG_CHECK(mi + n <= old.measurements.size(), "--resume: the timings of {} count more measurements than the "
                   "file holds", t.id);
      f.measurements.assign(old.measurements.begin() + mi, old.measurements.begin() + mi + n);
      mi += n;
    } else {
      HR_ARG_CHECK(pi + n <= old.sweep_points.size(), "--resume: the timings of {} count more sweep points than the "
                   "file holds", t.id);
      f.points.assign(old.sweep_points.begin() + pi, old.sweep_points.begin() + pi + n);
      pi += n;
    }
    const bool all_points_skipped =
        !f.points.empty() &&
        std::all_of(f.points.begin(), f.points.end(), [](const SweepPoint& p) { return p.status == "skipped"; });
    if (t.skipped.empty() && !all_points_skipped) finished[t.kind + ":" + t.id] = std::move(f);
  }
  HR_ARG_CHECK(mi == old.measurements.size() && pi == old.sweep_points.size(),
               "--resume: the file's timings do not account for all its measurements and sweep points");
  return finished;
}

Results run_suite(Device& dev, const RunOptions& opt, std::ostream* progress) {
  const Selection sel = select_specs(opt);
  Results r;
  r.run_time_utc = utc_now_iso8601();
  r.preset = preset_name(opt.preset);
  r.backend = backend_name(dev.kind());
  r.seed = opt.seed;
  r.only = opt.only;
  r.skip = opt.skip;
  r.dp_ranks = opt.dp_ranks;
  if (dev.is_cuda()) r.attention_kernel = ops::gpu_attention_kernel_name(ops::gpu_attention_kernel());
  r.device = dev.record();
  r.build = build_record();

  const auto t0 = std::chrono::steady_clock::now();
  const HostSample host_at_start = sample_host();
  const size_t total = sel.size();
  const ExpectedCosts costs = expected_costs(opt.preset, dev.kind());
  auto cost = [&](const auto& spec) {
    return costs.seconds(std::is_same_v<std::decay_t<decltype(spec)>, PropertySpec> ? "property" : "sweep", spec.id,
                         spec.expected_seconds_quick);
  };
  double expected_all = 0, expected_done = 0;
  for (auto* p : sel.properties) expected_all += cost(*p);
  for (auto* w : sel.sweeps) expected_all += cost(*w);
  size_t index = 0;
  std::string current;

  // Lines come from this thread and from the heartbeat's: one at a time.
  std::mutex say_mu, beat_mu;
  auto last_said = std::chrono::steady_clock::now();
  auto say = [&](const std::string& line) {
    if (!progress) return;
    std::lock_guard<std::mutex> lk(say_mu);
    (*progress) << line << std::endl;
    std::lock_guard<std::mutex> beat(beat_mu);
    last_said = std::chrono::steady_clock::now();
  };
  const bool calibrated = costs.calibrated;
  std::optional<Heartbeat> heartbeat;
  if (progress && opt.heartbeat_s > 0) heartbeat.emplace(say, beat_mu, last_said, opt.heartbeat_s);

  const std::map<std::string, FinishedSpec> finished =
      opt.resume != nullptr ? finished_specs(*opt.resume) : std::map<std::string, FinishedSpec>();
  if (opt.resume != nullptr) {
    const Results& old = *opt.resume;
    r.run_time_utc = old.run_time_utc;
  }
  bool lost = false;
  auto stopping = [&] { return lost || (opt.stop != nullptr && *opt.stop != 0); };
  // After a spec ran: a device this process can no longer use stops the run there.
  auto check_device = [&](const std::string& id) {
    std::string why;
    if (!opt.device_check || !opt.device_check(id, &why)) return;
    lost = true;
    if (opt.device_lost != nullptr) *opt.device_lost = fmt::format("{}: {}", id, why);
    say(fmt::format("headroom:        the device is unusable after {}: {}", id, why));
  };
  // After each spec that ran: what finished, with everything after it as not run,
  // except what a resumed run finished earlier (a new selection may put a new entry
  // before it): that goes into the file too, so a run killed now loses none of it.
  size_t specs_done = 0;
  auto checkpoint = [&] {
    ++specs_done;
    if (!opt.checkpoint || specs_done == total) return;
    Results partial = r;
    partial.incomplete = true;
    partial.not_run = r.not_run;
    size_t i = 0;
    for (auto* p : sel.properties) {
      if (i++ < specs_done) continue;
      if (auto f = finished.find("property:" + p->id); f != finished.end()) {
        partial.timings.push_back(f->second.timing);
        partial.measurements.insert(partial.measurements.end(), f->second.measurements.begin(),
                                    f->second.measurements.end());
      } else {
        partial.not_run.push_back(p->id);
      }
    }
    for (auto* w : sel.sweeps) {
      if (i++ < specs_done) continue;
      if (auto f = finished.find("sweep:" + w->id); f != finished.end()) {
        partial.timings.push_back(f->second.timing);
        partial.sweep_points.insert(partial.sweep_points.end(), f->second.points.begin(), f->second.points.end());
      } else {
        partial.not_run.push_back(w->id);
      }
    }
    partial.duration_s = seconds_since(t0);
    compute_totals(partial);
    opt.checkpoint(partial);
  };
  // Before anything runs, the folder says this run is under way: a run killed in
  // its first property leaves a file that --resume continues, never a previous
  // run's complete results passed off as this one's.
  if (opt.checkpoint && opt.resume == nullptr) {
    Results started = r;
    started.incomplete = true;
    for (auto* p : sel.properties) started.not_run.push_back(p->id);
    for (auto* w : sel.sweeps) started.not_run.push_back(w->id);
    compute_totals(started);
    opt.checkpoint(started);
  }
  auto announce = [&](const char* kind, const std::string& id, const std::string& title) {
    ++index;
    current = id;
    const double elapsed = seconds_since(t0);
    const double left = expected_left(elapsed, expected_done, expected_all - expected_done, calibrated);
    // Short titles on the progress line; the full title is in the report.
    const std::string shown = title.size() > 60 ? title.substr(0, title.rfind(' ', 57)) + "..." : title;
    say(fmt::format("headroom: [{:>{}}/{}] {} {} - {} (elapsed {}, {})", index, std::to_string(total).size(), total,
                    kind, id, shown, format_duration(elapsed),
                    left < 0 ? std::string("estimating the time left") : "~" + format_duration(left) + " left"));
    if (heartbeat) heartbeat->set(id);
  };

  RunContext ctx{dev, opt.preset, opt.seed, [&](const std::string& note) {
                   // A line for people: at most 120 columns.
                   std::string line = fmt::format("headroom:        {}: {}", current, note);
                   if (line.size() > 120) line = line.substr(0, 117) + "...";
                   say(line);
                 }};

  // One property or sweep: as it was in the resumed run when it finished there, not
  // run once the run is stopping, else run and timed, with a throw recorded as an
  // item of its own (the run goes on). Each starts from a clean peak, so its own
  // bytes are what it sees.
  auto run_spec = [&](const auto& spec, const char* kind, auto& into, auto resumed_items, auto error_item,
                      auto settle) {
    if (auto f = finished.find(std::string(kind) + ":" + spec.id); f != finished.end()) {
      r.timings.push_back(f->second.timing);
      for (const auto& item : resumed_items(f->second)) into.push_back(item);
      ++index;
      ++specs_done;
      expected_done += cost(spec);
      return;
    }
    if (stopping()) {
      r.not_run.push_back(spec.id);
      return;
    }
    announce(kind, spec.id, spec.title);
    SpecTiming timing{kind, spec.id, spec.title, 0, spec.expected_seconds_quick, 0, {}, {}};
    const auto s0 = std::chrono::steady_clock::now();
    std::remove_reference_t<decltype(into)> got;
    const int64_t sparse0 = sparse_micro_batches();
    try {
      dev.memory().reset_peak();
      got = spec.run(ctx);
    } catch (const Skipped& e) {
      timing.skipped = e.what();
      got.clear();
      say(fmt::format("headroom:        {} skipped: {}", spec.id, e.what()));
    } catch (const std::exception& e) {
      timing.error = error_text(e);
      got = {error_item(spec, timing.error)};
      say(fmt::format("headroom:        {} threw: {}", spec.id, timing.error));
    }
    // Language-model micro-batches with fewer than kMinRealTargets real targets that
    // this spec's steps saw: said in every item, so that no check over such batches
    // passes without saying so.
    if (const int64_t sparse = sparse_micro_batches() - sparse0; sparse > 0)
      for (auto& item : got) note_sparse(item, sparse);
    for (auto& item : got) settle(spec, item);
    timing.items = static_cast<int>(got.size());
    timing.seconds = seconds_since(s0);
    if (heartbeat) heartbeat->set("");
    if (timing.skipped.empty() && timing.error.empty())
      say(fmt::format("headroom:        {}: {} ({})", spec.id, outcome(got), format_duration(timing.seconds)));
    expected_done += cost(spec);
    r.timings.push_back(timing);
    for (auto& item : got) into.push_back(std::move(item));
    check_device(spec.id);
    checkpoint();
  };

  for (const PropertySpec* spec : sel.properties)
    run_spec(
        *spec, "property", r.measurements, [](const FinishedSpec& f) -> const std::vector<Measurement>& { return f.measurements; },
        [&](const PropertySpec& ps, const std::string& why) {
          return make_error_measurement(ps.id, ps.title, backend_name(dev.kind()), why);
        },
        [&](const PropertySpec& ps, Measurement& m) {
          if (m.backend.empty()) m.backend = backend_name(dev.kind());
          if (m.id.empty()) m.id = ps.id;
          if (m.title.empty()) m.title = ps.title;
          if (m.check.empty()) m.check = default_check_key(m);
          if (!m.passed)
            say(fmt::format("headroom:        {} {} {} {}: {}", m.id, m.backend, m.dtype, m.model,
                            m.negative_control ? "negative control NOT caught" : "FAILED"));
        });

  for (const SweepSpec* spec : sel.sweeps)
    run_spec(
        *spec, "sweep", r.sweep_points, [](const FinishedSpec& f) -> const std::vector<SweepPoint>& { return f.points; },
        [&](const SweepSpec& ws, const std::string& why) {
          SweepPoint p;
          p.sweep = ws.id;
          p.backend = backend_name(dev.kind());
          p.status = "error";
          p.reason = why;
          return p;
        },
        [&](const SweepSpec& ws, SweepPoint& p) {
          if (p.backend.empty()) p.backend = backend_name(dev.kind());
          if (p.sweep.empty()) p.sweep = ws.id;
        });

  r.duration_s = seconds_since(t0) + (opt.resume != nullptr ? opt.resume->duration_s : 0.0);
  r.incomplete = !r.not_run.empty();
  r.host = host_load_since(host_at_start);
  // A resumed run's timings come from two processes: the busier host is the one
  // that judges them.
  if (opt.resume != nullptr && opt.resume->host && opt.resume->host->busy() && !r.host->busy())
    r.host = opt.resume->host;
  if (r.incomplete)
    say(fmt::format("headroom: interrupted: {} of {} properties and sweeps did not run", r.not_run.size(), total));
  compute_totals(r);
  say(fmt::format("headroom: done in {}: {} of {} measurements passed ({} negative controls caught of {}), "
                  "{} sweep points ({} ok)",
                  format_duration(r.duration_s), r.totals.passed, r.totals.measurements,
                  r.totals.negative_controls_caught, r.totals.negative_controls, r.totals.sweep_points,
                  r.totals.sweep_points_ok));
  return r;
}

}  // namespace hr
