// Baseline comparison: matching sweep points, noise-aware time thresholds, exact-ish
// memory, conformance failures, device/driver flags, and the text form of it all.
#include "harness/results/compare.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <sstream>

#include "harness/memory.hpp"

namespace hr {

namespace {

std::string point_key(const std::string& sweep, const std::string& backend, const std::string& dtype,
                      const std::string& model, const nlohmann::json& config) {
  // nlohmann's object keys are sorted, so dump() is a canonical form of the config.
  return sweep + "\x1f" + backend + "\x1f" + dtype + "\x1f" + model + "\x1f" + config.dump();
}

std::string measurement_key(const Measurement& m) {
  return point_key(m.id, m.backend, m.dtype, m.model, m.config) + (m.negative_control ? "\x1fneg" : "");
}

std::string describe_point(const SweepPoint& p) {
  std::string s = p.sweep;
  for (const auto* part : {&p.backend, &p.dtype, &p.model})
    if (!part->empty()) s += " " + *part;
  const std::string cfg = config_label(p.config);
  if (!cfg.empty()) s += " " + cfg;
  return s;
}

std::string describe_measurement(const Measurement& m) {
  std::string s = m.id;
  for (const auto* part : {&m.backend, &m.dtype, &m.model})
    if (!part->empty()) s += " " + *part;
  const std::string cfg = config_label(m.config);
  if (!cfg.empty()) s += " " + cfg;
  return s;
}

std::string dev_str(const nlohmann::json& d, const char* key) {
  auto it = d.find(key);
  if (it == d.end() || it->is_null()) return "";
  return it->is_string() ? it->get<std::string>() : it->dump();
}

CompareRow base_row(const SweepPoint& p) {
  CompareRow r;
  r.sweep = p.sweep;
  r.backend = p.backend;
  r.dtype = p.dtype;
  r.model = p.model;
  r.config = p.config;
  return r;
}

std::string pct(double v) {
  if (!std::isfinite(v)) return v > 0 ? "+inf" : (v < 0 ? "-inf" : "n/a");
  return fmt::format("{:+.1f}%", v * 100.0);
}

void compare_memory(const SweepPoint& b, const SweepPoint& c, const CompareOptions& opt,
                    std::vector<CompareRow>& rows) {
  auto one = [&](const std::string& quantity, double bv, double cv, bool always) {
    CompareRow r = base_row(c);
    r.quantity = quantity;
    r.baseline = bv;
    r.current = cv;
    r.threshold = opt.memory_tolerance;
    if (bv == 0 && cv == 0) {
      r.change = 0;
    } else if (bv == 0) {
      r.change = INFINITY;
    } else {
      r.change = cv / bv - 1.0;
    }
    if (std::fabs(r.change) <= opt.memory_tolerance) r.verdict = "same";
    else if (r.change > 0) r.verdict = "regression", r.note = "more memory than the baseline";
    else r.verdict = "better", r.note = "less memory than the baseline";
    if (always || r.verdict != "same") rows.push_back(r);
  };
  if (b.memory.total_peak_bytes == 0 && c.memory.total_peak_bytes == 0) return;  // neither recorded memory
  one("peak bytes", static_cast<double>(b.memory.total_peak_bytes), static_cast<double>(c.memory.total_peak_bytes),
      true);
  for (Consumer k : kAllConsumers) {
    const double bv = static_cast<double>(b.memory.peak(k)), cv = static_cast<double>(c.memory.peak(k));
    if (bv == 0 && cv == 0) continue;
    one(std::string("peak ") + consumer_name(k), bv, cv, false);
  }
}

void compare_time(const SweepPoint& b, const SweepPoint& c, const CompareOptions& opt, std::vector<CompareRow>& rows) {
  if (!b.time || !c.time || !(b.time->median_s > 0) || !(c.time->median_s > 0)) return;
  CompareRow r = base_row(c);
  r.quantity = "step time";
  r.baseline = b.time->median_s;
  r.current = c.time->median_s;
  r.change = r.current / r.baseline - 1.0;
  const double nb = timing_noise(*b.time), nc = timing_noise(*c.time);
  r.threshold = std::max(opt.time_floor, std::sqrt(nb * nb + nc * nc));
  if (b.time->noisy || c.time->noisy) {
    r.verdict = "noisy";
    r.note = fmt::format("too noisy to compare (spread {:.0f}% baseline, {:.0f}% this run)", b.time->rel_spread * 100,
                         c.time->rel_spread * 100);
  } else if (std::fabs(r.change) <= r.threshold) {
    r.verdict = "same";
  } else if (r.change > 0) {
    r.verdict = "regression";
    r.note = fmt::format("slower by {:.1f}% (beyond the {:.1f}% noise threshold)", r.change * 100, r.threshold * 100);
  } else {
    r.verdict = "better";
    r.note = fmt::format("faster by {:.1f}%", -r.change * 100);
  }
  rows.push_back(r);
}

}  // namespace

std::string config_label(const nlohmann::json& config) {
  if (!config.is_object()) return config.is_null() ? "" : config.dump();
  std::string s;
  for (auto it = config.begin(); it != config.end(); ++it) {
    if (!s.empty()) s += " ";
    s += it.key() + "=" + (it->is_string() ? it->get<std::string>() : it->dump());
  }
  return s;
}

double timing_noise(const TimeStats& t) {
  const double mad_rel = t.median_s > 0 ? 4.0 * t.mad_s / t.median_s : 0.0;
  const double n = std::max(t.rel_spread, mad_rel);
  return std::isfinite(n) ? n : 0.0;
}

Comparison compare_results(const Results& base, const Results& cur, const CompareOptions& opt) {
  Comparison cmp;
  cmp.options = opt;

  // ---- The device and the run: compared anyway, but flagged.
  const auto& bd = base.device;
  const auto& cd = cur.device;
  if (dev_str(bd, "name") != dev_str(cd, "name") || dev_str(bd, "backend") != dev_str(cd, "backend") ||
      dev_str(bd, "compute_capability") != dev_str(cd, "compute_capability") ||
      dev_str(bd, "sm_count") != dev_str(cd, "sm_count")) {
    cmp.same_device = false;
    cmp.warnings.push_back(fmt::format("another device: the baseline ran on {} '{}', this run on {} '{}'; "
                                       "compared anyway, so differences may be the device's",
                                       dev_str(bd, "backend"), dev_str(bd, "name"), dev_str(cd, "backend"),
                                       dev_str(cd, "name")));
  }
  for (const char* key : {"driver_version", "runtime_version", "cublas_version"}) {
    if (dev_str(bd, key) != dev_str(cd, key))
      cmp.warnings.push_back(fmt::format("{} differs: baseline {}, this run {}", key,
                                         dev_str(bd, key).empty() ? "-" : dev_str(bd, key),
                                         dev_str(cd, key).empty() ? "-" : dev_str(cd, key)));
  }
  if (base.preset != cur.preset)
    cmp.warnings.push_back(fmt::format("presets differ: baseline {}, this run {}", base.preset, cur.preset));
  if (dev_str(base.build, "git_sha") != dev_str(cur.build, "git_sha"))
    cmp.warnings.push_back(fmt::format("builds differ: baseline {}, this run {}", dev_str(base.build, "git_sha"),
                                       dev_str(cur.build, "git_sha")));

  // ---- Conformance: every measurement of this run must pass.
  for (const auto& m : cur.measurements) {
    if (m.passed) continue;
    ++cmp.conformance_failed;
    if (is_error_measurement(m))
      cmp.failures.push_back(fmt::format("{} threw: {}", describe_measurement(m), m.details.value("error", "")));
    else if (m.negative_control)
      cmp.failures.push_back(fmt::format("{}: negative control not caught ({} {:.3g} <= {:.3g})",
                                         describe_measurement(m), m.metric, m.error, m.tolerance));
    else
      cmp.failures.push_back(fmt::format("{}: {} {:.3g} exceeds the tolerance {:.3g}", describe_measurement(m),
                                         m.metric, m.error, m.tolerance));
  }
  if (cur.measurements.empty() && base.measurements.empty())
    cmp.warnings.push_back("neither run has conformance measurements");
  {
    std::map<std::string, int> have;
    for (const auto& m : cur.measurements) ++have[measurement_key(m)];
    int absent = 0;
    std::string example;
    for (const auto& m : base.measurements) {
      if (have.count(measurement_key(m))) continue;
      if (absent++ == 0) example = describe_measurement(m);
    }
    if (absent > 0)
      cmp.warnings.push_back(fmt::format("{} conformance measurement{} of the baseline {} not in this run (e.g. {})",
                                         absent, absent == 1 ? "" : "s", absent == 1 ? "is" : "are", example));
  }

  // ---- Sweep points: matched by sweep, backend, dtype, model and config.
  std::multimap<std::string, size_t> by_key;
  for (size_t i = 0; i < cur.sweep_points.size(); ++i) {
    const auto& p = cur.sweep_points[i];
    by_key.emplace(point_key(p.sweep, p.backend, p.dtype, p.model, p.config), i);
  }
  std::vector<bool> used(cur.sweep_points.size(), false);
  for (const auto& b : base.sweep_points) {
    const std::string key = point_key(b.sweep, b.backend, b.dtype, b.model, b.config);
    const SweepPoint* c = nullptr;
    for (auto [it, end] = by_key.equal_range(key); it != end; ++it) {
      if (!used[it->second]) {
        used[it->second] = true;
        c = &cur.sweep_points[it->second];
        break;
      }
    }
    if (c == nullptr) {
      CompareRow r = base_row(b);
      r.quantity = "status";
      r.verdict = "missing";
      r.note = "in the baseline, not in this run";
      cmp.rows.push_back(r);
      ++cmp.missing;
      continue;
    }
    ++cmp.matched_points;
    if (b.status != "ok" || c->status != "ok") {
      CompareRow r = base_row(*c);
      r.quantity = "status";
      if (b.status == c->status) {
        r.verdict = "same";
        r.note = fmt::format("{} in both runs", c->status);
      } else if (b.status == "ok") {
        r.verdict = "regression";
        r.note = fmt::format("ran in the baseline, {} now{}{}", c->status, c->reason.empty() ? "" : ": ", c->reason);
      } else if (c->status == "ok") {
        r.verdict = "better";
        r.note = fmt::format("{} in the baseline, runs now", b.status);
      } else {
        r.verdict = "same";
        r.note = fmt::format("{} in the baseline, {} now", b.status, c->status);
      }
      cmp.rows.push_back(r);
      continue;
    }
    compare_time(b, *c, opt, cmp.rows);
    compare_memory(b, *c, opt, cmp.rows);
  }
  for (size_t i = 0; i < cur.sweep_points.size(); ++i) {
    if (used[i]) continue;
    CompareRow r = base_row(cur.sweep_points[i]);
    r.quantity = "status";
    r.verdict = "new";
    r.note = "not in the baseline";
    cmp.rows.push_back(r);
    ++cmp.added;
  }

  for (const auto& r : cmp.rows) {
    if (r.verdict == "regression") {
      ++cmp.regressions;
      std::string what = r.quantity == "status" ? r.note
                         : r.quantity == "step time"
                             ? r.note
                             : fmt::format("{} {} -> {} ({}, tolerance {:.0f}%)", r.quantity, format_bytes(r.baseline),
                                           format_bytes(r.current), pct(r.change), r.threshold * 100);
      SweepPoint p;
      p.sweep = r.sweep, p.backend = r.backend, p.dtype = r.dtype, p.model = r.model, p.config = r.config;
      cmp.failures.push_back(fmt::format("{}: {}", describe_point(p), what));
    } else if (r.verdict == "better") {
      ++cmp.improvements;
    } else if (r.verdict == "noisy") {
      ++cmp.noisy;
    }
  }
  if (cmp.noisy > 0)
    cmp.warnings.push_back(fmt::format("{} timing{} too noisy to compare (relative spread above {:.0f}%)", cmp.noisy,
                                       cmp.noisy == 1 ? " was" : "s were", kNoisyRelSpread * 100));
  if (cmp.missing > 0)
    cmp.warnings.push_back(fmt::format("{} sweep point{} of the baseline {} not in this run", cmp.missing,
                                       cmp.missing == 1 ? "" : "s", cmp.missing == 1 ? "is" : "are"));
  // A comparison that compared nothing must not read as a pass.
  if (!base.sweep_points.empty() && cmp.matched_points == 0)
    cmp.failures.push_back(
        "nothing compared: no sweep point of this run matches the baseline (same sweep, backend, dtype, model and "
        "config); run the baseline's preset and backend");
  if (!base.measurements.empty() && cur.measurements.empty())
    cmp.failures.push_back("nothing checked: the baseline has conformance measurements and this run has none");
  return cmp;
}

std::string format_comparison_text(const Results& base, const Results& cur, const Comparison& c) {
  std::ostringstream o;
  o << fmt::format("baseline: {} on {} '{}' ({}, {} preset, {})\n", base.run_time_utc, dev_str(base.device, "backend"),
                   dev_str(base.device, "name"), dev_str(base.build, "git_sha"), base.preset, base.backend);
  o << fmt::format("this run: {} on {} '{}' ({}, {} preset, {})\n\n", cur.run_time_utc, dev_str(cur.device, "backend"),
                   dev_str(cur.device, "name"), dev_str(cur.build, "git_sha"), cur.preset, cur.backend);

  if (!c.rows.empty()) {
    // One line per point: its step time and total peak, the worst verdict of its
    // quantities, and a note for anything else that changed (a consumer's peak).
    struct Line {
      std::string point, time, mem, verdict, note;
    };
    auto rank = [](const std::string& v) {
      return v == "regression" ? 5 : v == "noisy" ? 4 : v == "missing" ? 3 : v == "better" ? 2 : v == "new" ? 1 : 0;
    };
    std::vector<Line> lines;
    std::string last_key;
    for (const auto& r : c.rows) {
      SweepPoint p;
      p.sweep = r.sweep, p.backend = r.backend, p.dtype = r.dtype, p.model = r.model, p.config = r.config;
      const std::string key = point_key(r.sweep, r.backend, r.dtype, r.model, r.config);
      if (lines.empty() || key != last_key) lines.push_back(Line{describe_point(p), "", "", "same", ""});
      last_key = key;
      Line& l = lines.back();
      if (rank(r.verdict) > rank(l.verdict)) l.verdict = r.verdict;
      auto add_note = [&](const std::string& n) { l.note += (l.note.empty() ? "" : "; ") + n; };
      if (r.quantity == "step time") {
        l.time = fmt::format("{:.4g} -> {:.4g} ms ({})", r.baseline * 1e3, r.current * 1e3, pct(r.change));
        if (r.verdict != "same" && r.verdict != "better") add_note(r.note);
      } else if (r.quantity == "peak bytes") {
        if (r.baseline == 0 && r.current == 0) continue;
        l.mem = fmt::format("{} -> {} ({})", format_bytes(r.baseline), format_bytes(r.current), pct(r.change));
      } else if (r.quantity == "status") {
        add_note(r.note);
      } else if (r.verdict != "same") {
        add_note(fmt::format("{} {}", r.quantity, pct(r.change)));
      }
    }
    size_t w[3] = {5, 9, 10};
    for (const auto& l : lines) {
      w[0] = std::max(w[0], std::min<size_t>(l.point.size(), 64));
      w[1] = std::max(w[1], l.time.size());
      w[2] = std::max(w[2], l.mem.size());
    }
    o << fmt::format("{:<{}}  {:<{}}  {:<{}}  {:<10}  {}\n", "point", w[0], "step time", w[1], "peak bytes", w[2],
                     "verdict", "note");
    for (const auto& l : lines)
      o << fmt::format("{:<{}}  {:<{}}  {:<{}}  {:<10}{}{}\n", l.point, w[0], l.time.empty() ? "-" : l.time, w[1],
                       l.mem.empty() ? "-" : l.mem, w[2], l.verdict, l.note.empty() ? "" : "  ", l.note);
    o << "\n";
  } else {
    o << "no sweep points to compare\n\n";
  }
  o << fmt::format("{} points matched: {} regressions, {} improvements, {} noisy, {} missing, {} new; "
                   "{} conformance failures\n",
                   c.matched_points, c.regressions, c.improvements, c.noisy, c.missing, c.added, c.conformance_failed);
  for (const auto& w : c.warnings) o << "warning: " << w << "\n";
  if (c.fit()) {
    o << "verdict: FIT - every conformance measurement passed and nothing regressed against the baseline\n";
  } else {
    o << fmt::format("verdict: NOT FIT - {} reason{}:\n", c.failures.size(), c.failures.size() == 1 ? "" : "s");
    for (const auto& f : c.failures) o << "  - " << f << "\n";
  }
  return o.str();
}

}  // namespace hr
