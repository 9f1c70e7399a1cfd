// Baseline comparison: matching sweep points, step times by rank test and minimum
// effect (re-measured before a regression is called when validate can), exact-ish
// memory, check power, conformance failures, device/driver flags, and the text form.
#include "harness/results/compare.hpp"

#include "harness/text.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <sstream>
#include <utility>

#include "harness/memory.hpp"
#include "harness/tolerances.hpp"

namespace hr {

namespace {

std::string point_key(const std::string& sweep, const std::string& backend, const std::string& dtype,
                      const std::string& model, const nlohmann::json& config) {
  // nlohmann's object keys are sorted, so dump() is a canonical form of the config.
  return sweep + "\x1f" + backend + "\x1f" + dtype + "\x1f" + model + "\x1f" + config.dump();
}


std::string describe_point(const SweepPoint& p) {
  std::string s = p.sweep;
  for (const auto* part : {&p.backend, &p.dtype, &p.model})
    if (!part->empty()) s += " " + *part;
  const std::string cfg = config_label(p.config);
  if (!cfg.empty()) s += " " + cfg;
  return s;
}

// The point a comparison row is about (for describe_point).
SweepPoint point_of(const CompareRow& r) {
  SweepPoint p;
  p.sweep = r.sweep, p.backend = r.backend, p.dtype = r.dtype, p.model = r.model, p.config = r.config;
  return p;
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
  if (c.memory.total_peak_bytes == 0) {
    // Nothing recorded is no saving: a point whose peaks are all zero measured nothing.
    CompareRow r = base_row(c);
    r.quantity = "peak bytes";
    r.baseline = static_cast<double>(b.memory.total_peak_bytes);
    r.current = 0;
    r.change = -1;
    r.threshold = opt.memory_tolerance;
    r.verdict = "regression";
    r.note = "memory measured in the baseline, none recorded in this run";
    rows.push_back(r);
    return;
  }
  one("peak bytes", static_cast<double>(b.memory.total_peak_bytes), static_cast<double>(c.memory.total_peak_bytes),
      true);
  for (Consumer k : kAllConsumers) {
    const double bv = static_cast<double>(b.memory.peak(k)), cv = static_cast<double>(c.memory.peak(k));
    if (bv == 0 && cv == 0) continue;
    one(std::string("peak ") + consumer_name(k), bv, cv, false);
  }
}

// The reference work a timing's CPU samples were divided by, for people.
std::string reference_of(const TimeStats& t) {
  if (t.ref_cpu_samples_s.empty()) return "none";
  return t.ref_work.empty() ? std::string("unnamed (a file written before the reference work was named)") : t.ref_work;
}

bool is_time_quantity(const std::string& q) { return q == "step time" || q == "step cpu time"; }

std::string describe_change(double change) {
  return change >= 0 ? fmt::format("slower by {:.1f}%", change * 100) : fmt::format("faster by {:.1f}%", -change * 100);
}

// Times shown but never judged: BM-DP's CPU ranks (also those of a GPU run with too
// few GPUs) are host processes talking MPI over shared memory, so their times follow
// the host's cores and load, not the device; on two shared cores one run differs
// from the next by 30%.
bool time_not_judged(const SweepPoint& p) { return p.sweep == "BM-DP" && p.backend == "cpu"; }

std::string describe_host(const HostLoad& h) {
  std::string s = fmt::format("{} CPUs", h.cpus);
  if (h.other_busy_cpus >= 0) s += fmt::format(", {:.2g} busy with other work", h.other_busy_cpus);
  if (h.steal_fraction > 0) s += fmt::format(", {:.0f}% stolen", h.steal_fraction * 100);
  if (h.load_avg_end >= 0) s += fmt::format(", load average {:.2g}", h.load_avg_end);
  return s;
}

// Under a busy host a judged change within busy_time_floor is not a verdict.
void damp_for_busy_host(TimeJudgement& j, const CompareOptions& opt, bool busy, const std::string& host_note) {
  if (!busy || (j.verdict != "regression" && j.verdict != "better")) return;
  if (std::fabs(j.change) > opt.busy_time_floor) return;
  j.verdict = "noisy";
  j.note = fmt::format("{}, within the {:.0f}% minimum effect of a busy host ({}): too noisy to judge",
                       describe_change(j.change), opt.busy_time_floor * 100, host_note);
}

// Judges the point's step time into rows; returns whether it was judged on CPU time
// alone although a run had recorded a reference work (the runs' works differ).
bool compare_time(const SweepPoint& b, const SweepPoint& c, const CompareOptions& opt, const Remeasure& remeasure,
                  bool busy, const std::string& host_note, std::vector<CompareRow>& rows) {
  if (!b.time) return false;  // the baseline did not time it: nothing to hold this run to
  // Not timed, or timed without the samples the baseline's are tested against (the
  // judged file's own summary, its spread and "noisy", would set its bound).
  const char* unjudgeable = !c.time ? "timed in the baseline, not timed in this run"
                            : !b.time->samples_s.empty() && c.time->samples_s.empty()
                                ? "the baseline recorded every timed repetition; this run recorded none to test "
                                  "against them (a file written before they were recorded, or without them): time it "
                                  "again"
                                : nullptr;
  if (unjudgeable) {
    CompareRow r = base_row(c);
    r.quantity = "step time";
    r.baseline = b.time->median_s;
    if (c.time) r.current = c.time->median_s, r.change = r.current / r.baseline - 1.0;
    r.verdict = "regression";
    r.note = unjudgeable;
    rows.push_back(r);
    return false;
  }
  CompareRow r = base_row(c);
  TimeJudgement j = judge_step_time(*b.time, *c.time, opt);
  if (time_not_judged(c)) {
    r.quantity = "step time";
    r.baseline = j.baseline_s;
    r.current = j.current_s;
    r.change = j.change;
    r.threshold = j.threshold;
    r.p_value = j.p_value;
    r.verdict = j.verdict == "same" ? "same" : "noisy";
    r.note = fmt::format("{}; not judged: MPI ranks on the host CPU time the host, not the device", describe_change(j.change));
    rows.push_back(r);
    return false;
  }
  damp_for_busy_host(j, opt, busy, host_note);
  r.quantity = j.cpu_time ? "step cpu time" : "step time";
  r.baseline = j.baseline_s;
  r.current = j.current_s;
  r.change = j.change;
  r.threshold = busy ? std::max(j.threshold, opt.busy_time_floor) : j.threshold;
  r.p_value = j.p_value;
  r.verdict = j.verdict;
  r.note = j.note;
  if (r.verdict == "regression" && remeasure) {
    // A suspected regression: measure the point again before calling it one. A
    // machine shared with other work drifts; a real regression stays.
    std::optional<Remeasured> measured;
    std::string why = "the sweep cannot re-measure this point";
    try {
      measured = remeasure(c);
    } catch (const std::exception& e) {
      why = e.what();
    }
    const SweepPoint* again = measured ? &measured->point : nullptr;
    if (again && again->status == "ok" && again->time && again->time->median_s > 0) {
      TimeJudgement k = judge_step_time(*b.time, *again->time, opt);
      // Judged as the run was, and as loosely again where the host was busy while
      // the point was measured again (another tenant may come between the two).
      const bool busy_again = measured->host && measured->host->busy();
      damp_for_busy_host(k, opt, busy || busy_again,
                         busy_again ? fmt::format("{}{}re-measurement: {}", host_note, host_note.empty() ? "" : "; ",
                                                  describe_host(*measured->host))
                                    : host_note);
      r.remeasured = k.current_s;
      r.remeasured_change = k.change;
      if (k.verdict == "regression") {
        r.note = fmt::format("{}; confirmed on re-measurement: {} (p={:.2g})", j.note, describe_change(k.change),
                             k.p_value);
      } else if (busy_again && k.verdict == "noisy") {
        r.verdict = "noisy";
        r.remeasured_on_busy_host = true;
        r.note = fmt::format("{} in the run; on re-measurement {}", describe_change(j.change), k.note);
      } else {
        r.verdict = "noisy";
        r.note = fmt::format("{} in the run, but {} on re-measurement ({}): the machine drifted, not judged",
                             describe_change(j.change), describe_change(k.change), k.verdict);
      }
    } else {
      if (again && again->status != "ok") why = fmt::format("{} on re-measurement{}{}", again->status,
                                                            again->reason.empty() ? "" : ": ", again->reason);
      r.note = fmt::format("{}; not re-measured ({})", j.note, why);
    }
  }
  rows.push_back(r);
  return j.cpu_time && j.reference_differs;
}

// Check power per (id, backend, dtype, model): whether the group is in the run at
// all, and the smallest power over its caught controls.
struct PowerGroup {
  bool present = false;
  std::optional<double> power;
  Measurement example;  // for the row's id, backend, dtype and model
};

std::map<std::string, PowerGroup> power_groups(const std::vector<Measurement>& ms) {
  std::map<std::string, PowerGroup> g;
  for (const auto& m : ms) {
    PowerGroup& pg = g[point_key(m.id, m.backend, m.dtype, m.model, nlohmann::json::object())];
    if (!pg.present) pg.example = m;
    pg.present = true;
    if (m.negative_control && m.passed && m.power && std::isfinite(*m.power))
      pg.power = pg.power ? std::min(*pg.power, *m.power) : *m.power;
  }
  return g;
}

std::string power_str(double v) { return std::isfinite(v) ? fmt::format("{:.4g}x", v) : std::string("none"); }

void compare_power(const Results& base, const Results& cur, const CompareOptions& opt, std::vector<CompareRow>& rows) {
  const auto bg = power_groups(base.measurements), cg = power_groups(cur.measurements);
  for (const auto& [key, b] : bg) {
    auto it = cg.find(key);
    if (it == cg.end() || !it->second.present) continue;  // not run: the missing-measurements warning says so
    const PowerGroup& c = it->second;
    if (!b.power && !c.power) continue;
    CompareRow r;
    r.sweep = c.example.id;
    r.backend = c.example.backend;
    r.dtype = c.example.dtype;
    r.model = c.example.model;
    r.quantity = "power";
    r.threshold = opt.power_growth - 1.0;
    r.baseline = b.power ? *b.power : NAN;
    r.current = c.power ? *c.power : NAN;
    if (!b.power) {
      r.verdict = "new";
      r.note = fmt::format("check power {} the bound; the baseline had none", power_str(r.current));
    } else if (!c.power) {
      r.verdict = "regression";
      r.note = fmt::format("check power lost: the baseline's controls were caught down to {} the bound, this "
                           "run's catch none (a control missing or not caught)",
                           power_str(r.baseline));
    } else {
      r.change = r.current / r.baseline - 1.0;
      if (r.current > opt.power_growth * r.baseline) {
        r.verdict = "regression";
        r.note = fmt::format("check power {} -> {} the bound: the check now only sees errors {:.3g}x larger than "
                             "the baseline's smallest (more than {:g}x)",
                             power_str(r.baseline), power_str(r.current), r.current / r.baseline, opt.power_growth);
      } else if (r.current * opt.power_growth < r.baseline) {
        r.verdict = "better";
        r.note = fmt::format("check power {} -> {} the bound: the check sees smaller errors", power_str(r.baseline),
                             power_str(r.current));
      } else {
        r.verdict = "same";
      }
    }
    rows.push_back(r);
  }
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

RankTest mann_whitney_u(const std::vector<double>& a, const std::vector<double>& b) {
  RankTest t;
  const double na = static_cast<double>(a.size()), nb = static_cast<double>(b.size());
  if (a.empty() || b.empty()) return t;
  // Ranks of the pooled samples (ties get their average rank), and the tie term.
  std::vector<std::pair<double, bool>> all;  // value, from a
  for (double v : a) all.emplace_back(v, true);
  for (double v : b) all.emplace_back(v, false);
  std::sort(all.begin(), all.end(), [](const auto& x, const auto& y) { return x.first < y.first; });
  const double n = na + nb;
  double rank_sum_a = 0, ties = 0;
  for (size_t i = 0; i < all.size();) {
    size_t j = i;
    while (j < all.size() && all[j].first == all[i].first) ++j;
    const double avg_rank = (static_cast<double>(i + 1) + static_cast<double>(j)) / 2.0;
    const double tied = static_cast<double>(j - i);
    ties += tied * tied * tied - tied;
    for (size_t k = i; k < j; ++k)
      if (all[k].second) rank_sum_a += avg_rank;
    i = j;
  }
  t.u_a = rank_sum_a - na * (na + 1) / 2.0;
  const double mean = na * nb / 2.0;
  const double var = na * nb / 12.0 * ((n + 1) - (n > 1 ? ties / (n * (n - 1)) : 0.0));
  if (!(var > 0)) return t;  // every sample equal: no evidence either way
  const double diff = t.u_a - mean;
  const double corrected = std::max(0.0, std::fabs(diff) - 0.5);  // continuity correction
  t.z = std::copysign(corrected / std::sqrt(var), diff);
  t.p_two_sided = std::min(1.0, std::erfc(corrected / std::sqrt(var) / std::sqrt(2.0)));
  return t;
}

TimeJudgement judge_step_time(const TimeStats& b, const TimeStats& c, const CompareOptions& opt) {
  TimeJudgement j;
  j.baseline_s = b.median_s;
  j.current_s = c.median_s;
  j.change = c.median_s / b.median_s - 1.0;
  j.cpu_time = !b.cpu_samples_s.empty() && !c.cpu_samples_s.empty();
  std::vector<double> bs = j.cpu_time ? b.cpu_samples_s : b.samples_s;
  std::vector<double> cs = j.cpu_time ? c.cpu_samples_s : c.samples_s;
  double scale = 1.0;  // the baseline's reference time: ratios back to seconds
  if (j.cpu_time) {
    // Each step's CPU time over the reference work's right after it, when both
    // runs have it: the machine's own speed changes cancel.
    auto ratios = [](const TimeStats& t, std::vector<double>& out) {
      if (t.ref_cpu_samples_s.size() != t.cpu_samples_s.size()) return false;
      std::vector<double> r;
      for (size_t i = 0; i < t.cpu_samples_s.size(); ++i) {
        if (!(t.ref_cpu_samples_s[i] > 0)) return false;
        r.push_back(t.cpu_samples_s[i] / t.ref_cpu_samples_s[i]);
      }
      out = std::move(r);
      return true;
    };
    // Only where both ran the same reference work: a ratio to another work is
    // another unit (a file written before the reference was named ran another).
    std::vector<double> rb, rc;
    j.reference_differs = reference_of(b) != reference_of(c);
    if (!j.reference_differs && ratios(b, rb) && ratios(c, rc)) {
      j.relative_to_reference = true;
      bs = std::move(rb);
      cs = std::move(rc);
      scale = summarize_times(b.ref_cpu_samples_s).median_s;
    }
    j.baseline_s = summarize_times(bs).median_s * scale;
    j.current_s = summarize_times(cs).median_s * scale;
    j.change = j.baseline_s > 0 ? j.current_s / j.baseline_s - 1.0 : NAN;
  }
  if (!bs.empty() && !cs.empty() && std::isfinite(j.change)) {
    const double floor = j.cpu_time ? opt.cpu_time_floor : opt.time_floor;
    j.threshold = floor;
    j.p_value = mann_whitney_u(cs, bs).p_two_sided;
    const bool large = std::fabs(j.change) > floor;
    const bool significant = j.p_value < opt.time_alpha;
    const std::string test =
        fmt::format("rank test p={:.2g} over {} and {} {}samples{}", j.p_value, bs.size(), cs.size(),
                    j.cpu_time ? "CPU-time " : "",
                    j.relative_to_reference ? " relative to the reference work"
                    : j.reference_differs   ? " (the runs' reference works differ: not relative to them)"
                                            : "");
    if (!large) {
      j.verdict = "same";
    } else if (!significant) {
      j.verdict = "noisy";
      j.note = fmt::format("{} but undecidable: {} (needs p < {:g})", describe_change(j.change), test,
                           opt.time_alpha);
    } else if (j.change > 0) {
      j.verdict = "regression";
      j.note = fmt::format("{} (beyond the {:.0f}% minimum effect, {})", describe_change(j.change), floor * 100,
                           test);
    } else {
      j.verdict = "better";
      j.note = fmt::format("{} ({})", describe_change(j.change), test);
    }
    return j;
  }
  // A file without samples: the old threshold from each run's own spread. A run's
  // spread counts only where its samples back it (they set it when read); a judged
  // file without them is held to the baseline's spread, never to its own claim.
  const bool c_backed = !c.samples_s.empty();
  const double nb = timing_noise(b), nc = c_backed ? timing_noise(c) : nb;
  j.threshold = std::max(opt.time_floor, std::sqrt(nb * nb + nc * nc));
  if (b.noisy || (c_backed && c.noisy)) {
    j.verdict = "noisy";
    j.note = fmt::format("too noisy to compare (spread {:.0f}% baseline, {:.0f}% this run)", b.rel_spread * 100,
                         c.rel_spread * 100);
  } else if (std::fabs(j.change) <= j.threshold) {
    j.verdict = "same";
  } else if (j.change > 0) {
    j.verdict = "regression";
    j.note = fmt::format("{} (beyond the {:.1f}% noise threshold; no samples recorded for a rank test)",
                         describe_change(j.change), j.threshold * 100);
  } else {
    j.verdict = "better";
    j.note = describe_change(j.change);
  }
  return j;
}

namespace {

std::string selection_label(const Results& r) {
  std::string s;
  if (!r.only.empty()) s += fmt::format("--only '{}'", r.only);
  if (!r.skip.empty()) s += fmt::format("{}--skip '{}'", s.empty() ? "" : " ", r.skip);
  return s.empty() ? std::string("everything") : s;
}

// Why a check (or point) of the baseline is not in this run, from the run's own record.
std::string why_missing(const Results& cur, const std::string& id, bool selection_differs) {
  for (const auto& t : cur.timings)
    if (t.id == id && !t.skipped.empty()) return fmt::format("skipped in this run: {}", t.skipped);
  if (std::find(cur.not_run.begin(), cur.not_run.end(), id) != cur.not_run.end())
    return "not run: this run was interrupted";
  if (selection_differs)
    return fmt::format("not in this run (its selection, {}, is not the baseline's)", selection_label(cur));
  return "not in this run";
}

// The bound a matched measurement is judged under: the baseline's, or with a run of
// this build the tighter of the two (the smaller for a check, the larger for a
// control to exceed).
double judged_bound(const Measurement& b, const Measurement& c, const CompareOptions& opt) {
  if (!opt.run_is_this_build) return b.tolerance;
  return b.negative_control ? std::max(b.tolerance, c.tolerance) : std::min(b.tolerance, c.tolerance);
}

}  // namespace

Comparison compare_results(const Results& base, const Results& cur, const CompareOptions& opt,
                           const Remeasure& remeasure) {
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
    cmp.failures.push_back(fmt::format("presets differ: baseline {}, this run {}: the checks and sweep points are not "
                                       "the same; run the baseline's preset",
                                       base.preset, cur.preset));
  if (base.backend != cur.backend)
    cmp.failures.push_back(fmt::format("backends differ: baseline {}, this run {}", base.backend, cur.backend));
  if (!base.attention_kernel.empty() && !cur.attention_kernel.empty() && base.attention_kernel != cur.attention_kernel)
    cmp.failures.push_back(fmt::format("attention kernels differ: baseline {}, this run {}: every time through "
                                       "attention is another kernel's; run the baseline's (HEADROOM_ATTENTION_KERNEL)",
                                       base.attention_kernel, cur.attention_kernel));
  else if (base.backend == "cuda" && base.attention_kernel.empty() != cur.attention_kernel.empty())
    cmp.warnings.push_back(fmt::format("the {} does not say which attention kernels it ran (written before they were "
                                       "recorded); the other ran {}: times through attention may be other kernels'",
                                       base.attention_kernel.empty() ? "baseline" : "run",
                                       base.attention_kernel.empty() ? cur.attention_kernel : base.attention_kernel));
  if (dev_str(base.build, "git_sha") != dev_str(cur.build, "git_sha"))
    cmp.warnings.push_back(fmt::format("builds differ: baseline {}, this run {}", dev_str(base.build, "git_sha"),
                                       dev_str(cur.build, "git_sha")));
  cmp.seeds_differ = base.seed != cur.seed;
  if (cmp.seeds_differ)
    cmp.warnings.push_back(fmt::format("seeds differ (baseline {}, this run {}): every check is held to the baseline's "
                                       "bound, but check power is shown, not judged",
                                       base.seed, cur.seed));
  const bool selection_differs = base.only != cur.only || base.skip != cur.skip;
  for (const bool is_cur : {false, true}) {
    const Results* r = is_cur ? &cur : &base;
    if (r->host && r->host->busy()) {
      if (is_cur && !opt.run_is_this_build) {
        // A judged file's word that its host was busy would widen its own bound:
        // taken only from a run this command measured.
        cmp.warnings.push_back(fmt::format("this run's file says its host was busy ({}); not taken as a reason to "
                                           "judge its step times more loosely (only a run validate measures itself "
                                           "is)",
                                           describe_host(*r->host)));
        continue;
      }
      cmp.host_busy = true;
      cmp.host_note += fmt::format("{}{}: {}", cmp.host_note.empty() ? "" : "; ", is_cur ? "this run" : "baseline",
                                   describe_host(*r->host));
    }
  }
  if (cmp.host_busy)
    cmp.warnings.push_back(fmt::format("a host was busy with other work ({}): step-time changes within {:.0f}% are too "
                                       "noisy to judge",
                                       cmp.host_note, opt.busy_time_floor * 100));

  // CPU points judged without the reference work although a run recorded one.
  int without_reference = 0;
  std::pair<std::string, std::string> reference_pair;
  // Points that timed other attention kernels than the baseline's.
  int other_kernels = 0;
  std::string other_kernels_first;

  // ---- Conformance: every measurement of the baseline, matched by its check key
  // (the n-th of a key with the n-th), held to the baseline's bound.
  std::map<std::string, std::vector<const Measurement*>> by_check;
  auto check_of = [](const Measurement& m) { return m.check.empty() ? default_check_key(m) : m.check; };
  for (const auto& m : cur.measurements) by_check[check_of(m)].push_back(&m);
  std::map<std::string, size_t> taken;
  std::set<const Measurement*> matched;
  int missing_checks = 0;
  std::string first_missing;
  for (const auto& b : base.measurements) {
    CheckRow row;
    row.check = check_of(b);
    row.description = fmt::format("{}: {}", describe_measurement(b), b.title);
    row.negative_control = b.negative_control;
    const auto& list = by_check[row.check];
    size_t& k = taken[row.check];
    if (k >= list.size()) {
      row.verdict = "missing";
      row.bound = b.tolerance;
      row.message = why_missing(cur, b.id, selection_differs);
      if (missing_checks++ == 0) first_missing = fmt::format("{} ({})", row.description, row.message);
      cmp.checks.push_back(std::move(row));
      continue;
    }
    const Measurement& c = *list[k++];
    matched.insert(&c);
    ++cmp.checks_matched;
    Measurement judged = c;
    judged.tolerance = judged_bound(b, c, opt);
    judged.negative_control = b.negative_control;
    judged.control = b.control;
    row.error = c.error;
    row.bound = judged.tolerance;
    const bool ok = recomputed_verdict(judged);
    row.verdict = ok ? "pass" : "fail";
    if (!ok) {
      ++cmp.conformance_failed;
      if (is_error_measurement(c))
        row.message = fmt::format("threw: {}", c.details.value("error", ""));
      else if (b.negative_control)
        row.message = fmt::format("negative control not caught: {} {} against the bound {:.3g}{}", c.metric,
                                  json_number(c.error).dump(), judged.tolerance,
                                  b.control == "subtle" ? fmt::format(" (a subtle one must lie within {:g}x of it)",
                                                                      tol::kSubtleControlMaxPower)
                                                        : "");
      else
        row.message = fmt::format("{} {} exceeds the bound {:.3g}", c.metric, json_number(c.error).dump(),
                                  judged.tolerance);
      if (!opt.run_is_this_build && c.tolerance != judged.tolerance)
        row.message += fmt::format(" (the judged file gives {:.3g}; the baseline's bound decides)", c.tolerance);
      cmp.failures.push_back(fmt::format("{}: {}", describe_measurement(b), row.message));
    }
    cmp.checks.push_back(std::move(row));
  }
  cmp.checks_missing = missing_checks;
  if (missing_checks > 0)
    cmp.failures.push_back(fmt::format("{} conformance measurement{} of the baseline {} missing from this run (first: "
                                       "{}); a check not run is not a pass",
                                       missing_checks, missing_checks == 1 ? "" : "s",
                                       missing_checks == 1 ? "is" : "are", first_missing));
  // The run's own measurements that the baseline does not have: judged by their own
  // bound (no baseline holds them), shown as new.
  for (const auto& m : cur.measurements) {
    if (matched.count(&m)) continue;
    ++cmp.checks_new;
    CheckRow row;
    row.check = check_of(m);
    row.description = fmt::format("{}: {}", describe_measurement(m), m.title);
    row.negative_control = m.negative_control;
    row.error = m.error;
    row.bound = m.tolerance;
    row.verdict = m.passed ? "new" : "fail";
    if (!m.passed) {
      ++cmp.conformance_failed;
      row.message = is_error_measurement(m) ? fmt::format("threw: {}", m.details.value("error", ""))
                    : m.negative_control    ? fmt::format("negative control not caught ({} {:.3g} <= {:.3g})",
                                                          m.metric, m.error, m.tolerance)
                                            : fmt::format("{} {:.3g} exceeds the tolerance {:.3g}", m.metric,
                                                          m.error, m.tolerance);
      cmp.failures.push_back(fmt::format("{}: {}", describe_measurement(m), row.message));
    }
    cmp.checks.push_back(std::move(row));
  }
  // Properties skipped on either side: the same reason on both is no difference.
  for (const auto& t : base.timings) {
    if (t.skipped.empty()) continue;
    for (const auto& u : cur.timings)
      if (u.id == t.id && u.kind == t.kind && !u.skipped.empty() && u.skipped != t.skipped)
        cmp.warnings.push_back(fmt::format("{} was skipped in both runs, for other reasons: baseline '{}', this run '{}'",
                                           t.id, t.skipped, u.skipped));
  }
  for (const auto& u : cur.timings) {
    if (u.skipped.empty()) continue;
    bool in_base = false;
    for (const auto& t : base.timings) in_base = in_base || (t.id == u.id && t.kind == u.kind);
    if (!in_base) cmp.warnings.push_back(fmt::format("{} was skipped in this run: {}", u.id, u.skipped));
  }
  if (cur.incomplete)
    cmp.failures.push_back(fmt::format("this run is incomplete (interrupted): {} of its properties and sweeps did not "
                                       "run; finish it with `headroom run --resume DIR`",
                                       cur.not_run.size()));
  if (cur.measurements.empty() && base.measurements.empty())
    cmp.warnings.push_back("neither run has conformance measurements");

  // ---- Check power: a property's controls must still show the smallest error they
  // did. Power depends on the seed's draws, so it is judged only between equal seeds.
  if (!cmp.seeds_differ) compare_power(base, cur, opt, cmp.rows);

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
      if (b.status == "skipped") {
        // The baseline measured nothing here: nothing is lost.
        r.verdict = "same";
        r.note = fmt::format("skipped in the baseline ({}), not in this run", b.reason);
      } else {
        r.verdict = "missing";
        r.note = fmt::format("in the baseline, {}", why_missing(cur, b.sweep, selection_differs));
        ++cmp.missing;
      }
      cmp.rows.push_back(r);
      continue;
    }
    ++cmp.matched_points;
    if (b.status != "ok" || c->status != "ok") {
      CompareRow r = base_row(*c);
      r.quantity = "status";
      if (b.status == c->status) {
        r.verdict = "same";
        r.note = c->status == "skipped" && b.reason != c->reason
                     ? fmt::format("skipped in both runs, for other reasons: baseline '{}', this run '{}'", b.reason,
                                   c->reason)
                     : fmt::format("{} in both runs", c->status);
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
    const size_t rows0 = cmp.rows.size();
    if (compare_time(b, *c, opt, remeasure, cmp.host_busy, cmp.host_note, cmp.rows) && without_reference++ == 0)
      reference_pair = {reference_of(*b.time), reference_of(*c->time)};
    // Where both runs say which attention kernels a point timed, and they differ
    // (a library that built no graph for a shape on one machine), its times are of
    // different kernels: said in its row and in a warning. The label tells the
    // directions apart wherever they differ.
    const std::string kb = attention_kernels_label(b), kc = attention_kernels_label(*c);
    if (!kb.empty() && !kc.empty() && kb != kc) {
      // With why, where a run says why it did not run what it asked for.
      auto why = [](const SweepPoint& p) {
        const std::string fell = attention_fallbacks_label(p);
        return fell.empty() ? fell : " (" + fell + ")";
      };
      const std::string what = fmt::format("attention kernels: baseline {}{}; this run {}{}", kb, why(b), kc, why(*c));
      if (cmp.rows.size() > rows0) cmp.rows[rows0].note += "; the runs timed other " + what;
      if (other_kernels++ == 0) other_kernels_first = fmt::format("{}: {}", describe_point(*c), what);
    }
    compare_memory(b, *c, opt, cmp.rows);
  }
  if (other_kernels > 0)
    cmp.warnings.push_back(fmt::format("{} point{} timed other attention kernels than the baseline's (first: {}): "
                                       "their step times compare different kernels",
                                       other_kernels, other_kernels == 1 ? "" : "s", other_kernels_first));
  if (without_reference > 0)
    cmp.warnings.push_back(fmt::format(
        "{} CPU step time{} judged on CPU time alone, not relative to the reference work: the runs did not run the "
        "same one (baseline: {}; this run: {}); CPU time alone moves with the machine's state, so record the baseline "
        "again with this build",
        without_reference, without_reference == 1 ? "" : "s", reference_pair.first, reference_pair.second));
  for (size_t i = 0; i < cur.sweep_points.size(); ++i) {
    if (used[i]) continue;
    CompareRow r = base_row(cur.sweep_points[i]);
    r.quantity = "status";
    r.verdict = "new";
    r.note = "not in the baseline";
    cmp.rows.push_back(r);
    ++cmp.added;
  }
  // A point of this run that ended in error measured nothing, baseline or not.
  for (const auto& p : cur.sweep_points)
    if (p.status == "error")
      cmp.failures.push_back(fmt::format("{}: ended in error: {}", describe_point(p), p.reason));

  int injected = 0;
  for (const auto& p : cur.sweep_points)
    if (p.metrics.contains("injected_slowdown")) ++injected;
  if (injected > 0)
    cmp.warnings.push_back(fmt::format("{} sweep point{} of this run ran with an injected slowdown ({})", injected,
                                       injected == 1 ? "" : "s", kInjectSlowdownEnv));
  for (const auto& r : cmp.rows) {
    if (std::isfinite(r.remeasured)) {
      ++cmp.remeasured;
      // Drift: not confirmed, other than too noisy to judge on a busy host.
      if (r.verdict != "regression" && !r.remeasured_on_busy_host) ++cmp.drifted;
    }
    if (r.verdict == "regression") {
      ++cmp.regressions;
      std::string what = r.quantity == "status" || is_time_quantity(r.quantity) || r.quantity == "power" ||
                                 (r.quantity == "peak bytes" && r.current == 0)
                             ? r.note
                             : fmt::format("{} {} -> {} ({}, tolerance {:.0f}%)", r.quantity, format_bytes(r.baseline),
                                           format_bytes(r.current), pct(r.change), r.threshold * 100);
      const SweepPoint p = point_of(r);
      cmp.failures.push_back(fmt::format("{}: {}", describe_point(p), what));
    } else if (r.verdict == "better") {
      ++cmp.improvements;
    } else if (r.verdict == "noisy") {
      ++cmp.noisy;
    }
  }
  if (cmp.noisy > 0)
    cmp.warnings.push_back(fmt::format("{} timing{} could not be judged (noisy: see the notes)", cmp.noisy,
                                       cmp.noisy == 1 ? "" : "s"));
  if (cmp.drifted > 0)
    cmp.warnings.push_back(fmt::format("{} of {} step time{} judged slower did not stay slower on re-measurement: "
                                       "the machine's speed drifts (shared or throttled?)",
                                       cmp.drifted, cmp.remeasured, cmp.remeasured == 1 ? "" : "s"));
  if (cmp.missing > 0) {
    std::string first;
    for (const auto& r : cmp.rows) {
      if (r.verdict != "missing") continue;
      const SweepPoint p = point_of(r);
      first = fmt::format("{}: {}", describe_point(p), r.note);
      break;
    }
    cmp.failures.push_back(fmt::format("{} sweep point{} of the baseline {} missing from this run (first: {})",
                                       cmp.missing, cmp.missing == 1 ? "" : "s", cmp.missing == 1 ? "is" : "are",
                                       first));
  }
  // A narrower selection than the baseline's is no verdict on the device.
  cmp.partial = selection_differs && (missing_checks > 0 || cmp.missing > 0);
  if (cmp.partial)
    cmp.failures.insert(cmp.failures.begin(),
                        fmt::format("partial: this run's selection ({}) is not the baseline's ({}); {} check{} and {} "
                                    "sweep point{} of the baseline were not run",
                                    selection_label(cur), selection_label(base), missing_checks,
                                    missing_checks == 1 ? "" : "s", cmp.missing, cmp.missing == 1 ? "" : "s"));
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
  if (c.seeds_differ)
    o << fmt::format("seeds differ: baseline seed {}, this run seed {} (check power is shown, not judged)\n", base.seed,
                     cur.seed);  // under 120 columns for any two 20-digit seeds
  for (const std::string& part :
       wrap_text(fmt::format("baseline: {} on {} '{}' ({}, {} preset, {}, seed {}, {})", base.run_time_utc,
                             dev_str(base.device, "backend"), dev_str(base.device, "name"),
                             dev_str(base.build, "git_sha"), base.preset, base.backend, base.seed, run_kind(base)),
                 kConsoleColumns, 10))
    o << part << "\n";
  for (const std::string& part :
       wrap_text(fmt::format("this run: {} on {} '{}' ({}, {} preset, {}, seed {}, {})", cur.run_time_utc,
                             dev_str(cur.device, "backend"), dev_str(cur.device, "name"), dev_str(cur.build, "git_sha"),
                             cur.preset, cur.backend, cur.seed, run_kind(cur)),
                 kConsoleColumns, 10))
    o << part << "\n";
  o << "\n";

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
      const SweepPoint p = point_of(r);
      const std::string key = point_key(r.sweep, r.backend, r.dtype, r.model, r.config);
      if (lines.empty() || key != last_key) lines.push_back(Line{describe_point(p), "", "", "same", ""});
      last_key = key;
      Line& l = lines.back();
      if (rank(r.verdict) > rank(l.verdict)) l.verdict = r.verdict;
      auto add_note = [&](const std::string& n) { l.note += (l.note.empty() ? "" : "; ") + n; };
      if (is_time_quantity(r.quantity)) {
        l.time = fmt::format("{:.4g} -> {:.4g} ms{} ({})", r.baseline * 1e3, r.current * 1e3,
                             r.quantity == "step cpu time" ? " cpu" : "", pct(r.change));
        if (r.verdict != "same" && r.verdict != "better") add_note(r.note);
      } else if (r.quantity == "power") {
        add_note(r.verdict == "same" || r.verdict == "new"
                     ? fmt::format("check power {} -> {} the bound", power_str(r.baseline), power_str(r.current))
                     : r.note);
      } else if (r.quantity == "peak bytes") {
        if (r.baseline == 0 && r.current == 0) continue;
        l.mem = fmt::format("{} -> {} ({})", format_bytes(r.baseline), format_bytes(r.current), pct(r.change));
      } else if (r.quantity == "status") {
        add_note(r.note);
      } else if (r.verdict != "same") {
        add_note(fmt::format("{} {}", r.quantity, pct(r.change)));
      }
    }
    // At most kConsoleColumns wide: a point too long for its column goes on a line of
    // its own above its numbers, and notes on lines of their own below (the report
    // has every detail).
    size_t w[3] = {5, 9, 10};
    for (const auto& l : lines) {
      w[1] = std::max(w[1], l.time.size());
      w[2] = std::max(w[2], l.mem.size());
    }
    const size_t rest = w[1] + 2 + w[2] + 2 + 10;
    w[0] = kConsoleColumns > rest + 2 + 20 ? std::min<size_t>(kConsoleColumns - rest - 2, 48) : 20;
    o << fmt::format("{:<{}}  {:<{}}  {:<{}}  {}\n", "point", w[0], "step time", w[1], "peak bytes", w[2], "verdict");
    for (const auto& l : lines) {
      std::string point = l.point;
      if (point.size() > w[0]) {
        for (const std::string& part : wrap_text(point, kConsoleColumns, 0)) o << part << "\n";
        point.clear();
      }
      o << fmt::format("{:<{}}  {:<{}}  {:<{}}  {}\n", point, w[0], l.time.empty() ? "-" : l.time, w[1],
                       l.mem.empty() ? "-" : l.mem, w[2], l.verdict);
      if (!l.note.empty())
        for (const std::string& part : wrap_text(l.note, kConsoleColumns, 4, true)) o << part << "\n";
    }
    o << "\n";
  } else {
    o << "no sweep points to compare\n\n";
  }
  o << fmt::format("{} of {} checks of the baseline matched, {} missing, {} failed, {} new in this run\n",
                   c.checks_matched, c.checks_matched + c.checks_missing, c.checks_missing, c.conformance_failed,
                   c.checks_new);
  o << fmt::format("{} points matched: {} regressions, {} improvements, {} noisy, {} missing, {} new\n",
                   c.matched_points, c.regressions, c.improvements, c.noisy, c.missing, c.added);
  for (const auto& w : c.warnings)
    for (const std::string& part : wrap_text("warning: " + w, kConsoleColumns, 9)) o << part << "\n";
  if (c.fit()) {
    o << "verdict: FIT - every check and sweep point of the baseline ran and held under its bound, and nothing "
         "regressed\n";
  } else if (c.partial) {
    o << fmt::format("verdict: PARTIAL (not fit) - {} reason{}:\n", c.failures.size(),
                     c.failures.size() == 1 ? "" : "s");
    for (const auto& f : c.failures)
      for (const std::string& part : wrap_text("- " + f, kConsoleColumns - 2, 2)) o << "  " << part << "\n";
  } else {
    o << fmt::format("verdict: NOT FIT - {} reason{}:\n", c.failures.size(), c.failures.size() == 1 ? "" : "s");
    for (const auto& f : c.failures)
      for (const std::string& part : wrap_text("- " + f, kConsoleColumns - 2, 2)) o << "  " << part << "\n";
  }
  return o.str();
}

}  // namespace hr
