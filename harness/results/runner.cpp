// The suite runner behind `headroom run` and `headroom validate`.
#include "harness/results/runner.hpp"

#include <fmt/format.h>
#include <re2/re2.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>
#include <map>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "harness/check.hpp"
#include "harness/step/train_step.hpp"

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

// Expected time left: the remaining specs' expected_seconds_quick, scaled by how
// fast the run has been against its own expectations so far (a full preset or a
// faster machine changes the scale; the first spec alone is a poor guide, so the
// observed ratio is blended with 1 until a few seconds have been observed).
double expected_left(double observed_s, double expected_done_s, double expected_left_s) {
  if (expected_done_s <= 0) return expected_left_s;
  const double ratio = observed_s / expected_done_s;
  const double weight = std::min(1.0, expected_done_s / 5.0);
  return expected_left_s * (weight * ratio + (1 - weight) * 1.0);
}

}  // namespace

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
  r.device = dev.record();
  r.build = build_record();

  const auto t0 = std::chrono::steady_clock::now();
  const HostSample host_at_start = sample_host();
  const size_t total = sel.size();
  double expected_all = 0, expected_done = 0;
  for (auto* p : sel.properties) expected_all += p->expected_seconds_quick;
  for (auto* w : sel.sweeps) expected_all += w->expected_seconds_quick;
  size_t index = 0;
  std::string current;

  auto say = [&](const std::string& line) {
    if (progress) (*progress) << line << std::endl;
  };

  // What a resumed run finished: each spec's items, cut from its measurements and
  // sweep points by the counts of its timings (which are written in run order).
  struct Finished {
    SpecTiming timing;
    std::vector<Measurement> measurements;
    std::vector<SweepPoint> points;
  };
  std::map<std::string, Finished> finished;
  if (opt.resume != nullptr) {
    const Results& old = *opt.resume;
    size_t mi = 0, pi = 0;
    for (const SpecTiming& t : old.timings) {
      Finished f{t, {}, {}};
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
      finished[t.kind + ":" + t.id] = std::move(f);
    }
    HR_ARG_CHECK(mi == old.measurements.size() && pi == old.sweep_points.size(),
                 "--resume: the file's timings do not account for all its measurements and sweep points");
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
  // After each spec that ran: what finished, with everything after it as not run.
  size_t finished_specs = 0;
  auto checkpoint = [&] {
    ++finished_specs;
    if (!opt.checkpoint || finished_specs == total) return;
    Results partial = r;
    partial.incomplete = true;
    partial.not_run = r.not_run;
    size_t i = 0;
    for (auto* p : sel.properties)
      if (i++ >= finished_specs) partial.not_run.push_back(p->id);
    for (auto* w : sel.sweeps)
      if (i++ >= finished_specs) partial.not_run.push_back(w->id);
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
    const double left = expected_left(elapsed, expected_done, expected_all - expected_done);
    say(fmt::format("headroom: [{:>{}}/{}] {} {} - {} (elapsed {}, ~{} left)", index,
                    std::to_string(total).size(), total, kind, id, title, format_duration(elapsed),
                    format_duration(left)));
  };

  RunContext ctx{dev, opt.preset, opt.seed, [&](const std::string& note) {
                   say(fmt::format("headroom:        {}: {}", current, note));
                 }};

  // One property or sweep: as it was in the resumed run when it finished there, not
  // run once the run is stopping, else run and timed, with a throw recorded as an
  // item of its own (the run goes on). Each starts from a clean peak, so its own
  // bytes are what it sees.
  auto run_spec = [&](const auto& spec, const char* kind, auto& into, auto resumed_items, auto error_item,
                      auto settle) {
    if (auto f = finished.find(std::string(kind) + ":" + spec.id); f != finished.end()) {
      r.timings.push_back(f->second.timing);
      for (auto& item : resumed_items(f->second)) into.push_back(std::move(item));
      ++index;
      ++finished_specs;
      expected_done += spec.expected_seconds_quick;
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
    expected_done += spec.expected_seconds_quick;
    r.timings.push_back(timing);
    for (auto& item : got) into.push_back(std::move(item));
    check_device(spec.id);
    checkpoint();
  };

  for (const PropertySpec* spec : sel.properties)
    run_spec(
        *spec, "property", r.measurements, [](Finished& f) -> std::vector<Measurement>& { return f.measurements; },
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
        *spec, "sweep", r.sweep_points, [](Finished& f) -> std::vector<SweepPoint>& { return f.points; },
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
