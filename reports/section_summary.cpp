// The report's first screen and its records: the summary, device and build, and
// the run record.
#include "reports/parts.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "harness/fit.hpp"
#include "harness/memory.hpp"
#include "harness/registry.hpp"
#include "harness/results/runner.hpp"
#include "reports/html.hpp"
#include "reports/svg.hpp"

namespace hr::report::detail {

using nlohmann::json;

// ---- Summary -------------------------------------------------------------------------

// The first screen in words: what passed, what failed, what did not run, and how
// sharp the checks are (the smallest fault each property's controls were caught at).
std::string glance(const Results& r) {
  std::set<std::string> ids, failed_ids;
  for (const auto& m : r.measurements) {
    ids.insert(m.id);
    if (!m.passed) failed_ids.insert(m.id);
  }
  std::string s = R"(<ul class="glance">)";
  s += fmt::format("<li><b>Passed:</b> {} of {} measurements over {} properties{}.</li>", r.totals.passed,
                   r.totals.measurements, ids.size(),
                   r.totals.negative_controls > 0
                       ? fmt::format(", {} of {} broken variants caught", r.totals.negative_controls_caught,
                                     r.totals.negative_controls)
                       : std::string());
  if (failed_ids.empty()) {
    s += "<li><b>Failed:</b> nothing.</li>";
  } else {
    std::string names;
    for (const auto& id : failed_ids) names += (names.empty() ? "" : ", ") + esc(id);
    s += fmt::format(R"(<li class="bad"><b>Failed:</b> {} measurement{} of {} ({}); see <a href="#conformance">)"
                     R"(Conformance</a>.</li>)",
                     r.totals.failed, r.totals.failed == 1 ? "" : "s", names, failed_ids.size() == 1 ? "one property" : fmt::format("{} properties", failed_ids.size()));
  }
  std::string not_run;
  for (const auto& t : r.timings)
    if (!t.skipped.empty()) not_run += (not_run.empty() ? "" : "; ") + esc(t.id) + " (" + esc(t.skipped) + ")";
  for (const auto& id : r.not_run) not_run += (not_run.empty() ? "" : "; ") + esc(id) + " (interrupted)";
  int points_not_run = 0;
  for (const auto& p : r.sweep_points) points_not_run += is_ok(p) ? 0 : 1;
  if (points_not_run > 0)
    not_run += fmt::format("{}{} sweep point{} (see the run record)", not_run.empty() ? "" : "; ", points_not_run,
                           points_not_run == 1 ? "" : "s");
  s += fmt::format("<li><b>Did not run:</b> {}.</li>", not_run.empty() ? "nothing" : not_run);
  std::vector<std::pair<double, std::string>> powers;
  int without = 0;
  for (const auto& id : ids) {
    const PropertyPower pp = property_power(r.measurements, id, "", "");
    if (pp.controls == 0) continue;
    if (pp.power) powers.emplace_back(*pp.power, id);
    else ++without;
  }
  if (!powers.empty()) {
    std::sort(powers.begin(), powers.end());
    const auto& median = powers[powers.size() / 2];
    const auto& bluntest = powers.back();
    s += fmt::format("<li><b>How sharp:</b> {} of {} subtle controls caught; the smallest fault a property's checks "
                     "were shown to see is {} its bound at the median property, {} to {} over all{}{}.</li>",
                     r.totals.subtle_controls_caught, r.totals.subtle_controls, esc(ratio_text(median.first)),
                     esc(ratio_text(powers.front().first)), esc(ratio_text(bluntest.first)),
                     fmt::format(" (bluntest: {})", esc(bluntest.second)),
                     without > 0 ? fmt::format("; {} with controls but none caught", without) : std::string());
  }
  return s + "</ul>";
}

std::string summary(const Results& r, const ReportOptions& opt) {
  const auto& t = r.totals;
  std::string s = section_open("summary", "Summary", "");
  s += R"(<div class="cards">)";
  // What kind of run this is comes first: a green page of an interrupted, partial
  // or failing run would mislead.
  {
    const std::string kind = run_kind(r);
    std::string what;
    if (kind == "interrupted") what = fmt::format("{} not run; finish it with headroom run --resume", r.not_run.size());
    else if (kind == "with errors")
      what = fmt::format("{} threw, {} sweep points in error", t.errors, t.sweep_points_error);
    else if (kind == "empty") what = "nothing was measured";
    else if (kind == "partial") {
      what = "a selection:";
      if (!r.only.empty()) what += " --only " + r.only;
      if (!r.skip.empty()) what += " --skip " + r.skip;
    } else {
      what = "every property and sweep of the preset";
    }
    if (t.specs_skipped > 0 && kind != "interrupted")
      what += fmt::format("; {} skipped here (see the run record)", t.specs_skipped);
    if (r.host)
      what += fmt::format("; host: {} CPUs{}", r.host->cpus,
                          r.host->other_busy_cpus >= 0
                              ? fmt::format(", {:.2g} busy with other work{}", r.host->other_busy_cpus,
                                            r.host->busy() ? " (busy)" : "")
                              : std::string());
    s += fmt::format(R"(<div class="card {}"><div class="k">Run</div><div class="v">{}</div><div class="s">{}</div></div>)",
                     kind == "complete" ? "ok" : (kind == "partial" ? "" : "bad"), esc(kind), esc(what));
  }
  const bool all_pass = t.failed == 0 && t.measurements > 0;
  s += fmt::format(R"(<div class="card {}"><div class="k">Conformance</div><div class="v">{} / {}</div><div class="s">measurements passed</div></div>)",
                   t.measurements == 0 ? "" : (all_pass ? "ok" : "bad"), t.passed, t.measurements);
  s += fmt::format(R"(<div class="card {}"><div class="k">Negative controls</div><div class="v">{} / {}</div><div class="s">broken variants caught, {} of {} subtle</div></div>)",
                   t.negative_controls == t.negative_controls_caught ? (t.negative_controls ? "ok" : "") : "bad",
                   t.negative_controls_caught, t.negative_controls, t.subtle_controls_caught, t.subtle_controls);
  s += fmt::format(R"(<div class="card {}"><div class="k">Failures</div><div class="v">{}</div><div class="s">{} threw an exception</div></div>)",
                   t.failed ? "bad" : "", t.failed, t.errors);
  s += fmt::format(R"(<div class="card"><div class="k">Sweep points</div><div class="v">{}</div><div class="s">{} ok, {} out of memory, {} skipped, {} error</div></div>)",
                   t.sweep_points, t.sweep_points_ok, t.sweep_points_out_of_memory, t.sweep_points_skipped,
                   t.sweep_points_error);
  if (opt.comparison) {
    const Comparison& c = *opt.comparison;
    const bool fit = c.fit();
    s += fmt::format(R"(<div class="card {}"><div class="k">Against baseline</div><div class="v">{}</div><div class="s">{} of {} checks matched, {} missing, {} failed; {} regressions, {} warnings</div></div>)",
                     fit ? "ok" : "bad", fit ? "FIT" : (c.partial ? "PARTIAL" : "NOT FIT"), c.checks_matched,
                     c.checks_matched + c.checks_missing, c.checks_missing, c.conformance_failed, c.regressions,
                     c.warnings.size());
  }
  s += "</div>";
  s += glance(r);
  s += R"(</section>)";
  return s;
}

// ---- Device and build ------------------------------------------------------------------

std::string version_text(const json& v) {
  if (!v.is_number_integer()) return str_of(json{{"v", v}}, "v");
  const long n = v.get<long>();
  if (n <= 0) return std::to_string(n);
  // CUDA encodes versions as 1000 * major + 10 * minor.
  return fmt::format("{} ({}.{})", n, n / 1000, (n % 1000) / 10);
}

std::string device_value(const std::string& key, const json& v) {
  if (key == "memory_bytes" && v.is_number()) return fmt_bytes_short(v.get<double>());
  if ((key == "sm_clock_khz" || key == "memory_clock_khz") && v.is_number())
    return fmt::format("{:.0f} MHz", v.get<double>() / 1000.0);
  if (key == "driver_version" || key == "runtime_version") return version_text(v);
  if (v.is_string()) return v.get<std::string>();
  if (v.is_boolean()) return v.get<bool>() ? "yes" : "no";
  return v.dump();
}

std::string kv_table(const json& obj, const std::vector<std::string>& order) {
  std::string s = R"(<table class="kv"><tbody>)";
  std::set<std::string> done;
  auto row = [&](const std::string& k) {
    if (!obj.contains(k) || done.count(k)) return;
    done.insert(k);
    s += fmt::format("<tr><td>{}</td><td>{}</td></tr>", esc(k), esc(device_value(k, obj[k])));
  };
  for (const auto& k : order) row(k);
  if (obj.is_object())
    for (auto it = obj.begin(); it != obj.end(); ++it) row(it.key());
  s += "</tbody></table>";
  return s;
}

namespace {
// Each label the sweep points carry (labels_of(p): a set of them), with how many
// points carry it and their sweeps.
template <typename LabelsOf>
std::map<std::string, std::pair<int, std::set<std::string>>> points_by_label(const Results& r, LabelsOf labels_of) {
  std::map<std::string, std::pair<int, std::set<std::string>>> by;
  for (const SweepPoint& p : r.sweep_points)
    for (const std::string& label : labels_of(p)) {
      ++by[label].first;
      by[label].second.insert(p.sweep);
    }
  return by;
}

// Which attention kernels the timed points ran: "cudnn in 30 points (BM-MB, BM-SEQ);
// scalar in 6 points (BM-PK)", from each point's kernel calls; "" where none was
// counted (no attention timed, or a file written before they were recorded).
std::string attention_kernels_timed(const Results& r) {
  const auto by_variant = points_by_label(r, [](const SweepPoint& p) { return attention_variants(p); });
  std::string s;
  for (const auto& [variant, seen] : by_variant)
    s += fmt::format("{}{} in {} point{} ({})", s.empty() ? "" : "; ", variant, seen.first, seen.first == 1 ? "" : "s",
                     fmt::join(seen.second, ", "));
  return s;
}
// Why the timed points' attention did not run what they asked for, each reason
// with its points and their sweeps; "" where every call ran what it asked for.
std::string attention_fallbacks_timed(const Results& r) {
  const auto by_reason = points_by_label(r, [](const SweepPoint& p) {
    const std::string why = attention_fallbacks_label(p);
    return why.empty() ? std::set<std::string>{} : std::set<std::string>{why};
  });
  std::string s;
  for (const auto& [why, seen] : by_reason)
    s += fmt::format("{}{} ({} point{}: {})", s.empty() ? "" : "; ", why, seen.first, seen.first == 1 ? "" : "s",
                     fmt::join(seen.second, ", "));
  return s;
}
}  // namespace

std::string device_section(const Results& r) {
  std::string s = section_open("device", "Device and build",
                               "What this run measured on, and the binary that measured it. A comparison flags any "
                               "difference in device, driver or build.");
  s += R"(<div class="two"><div><h3>Device</h3>)";
  s += kv_table(r.device, {"name", "backend", "compute_capability", "sm_count", "memory_bytes", "sm_clock_khz",
                           "memory_clock_khz", "memory_bus_bits", "driver_version", "runtime_version",
                           "cublas_version", "ecc", "uuid", "ordinal", "cores"});
  s += R"(</div><div><h3>Build</h3>)";
  s += kv_table(r.build, {"version", "git_sha", "build_type", "cxx_compiler", "cuda_compiler", "cuda_archs",
                          "cuda_backend"});
  s += R"(<h3>Run</h3>)";
  json run{{"started (UTC)", r.run_time_utc},
           {"duration", fmt::format("{:.1f} s", r.duration_s)},
           {"preset", r.preset},
           {"backend", r.backend},
           {"seed", std::to_string(r.seed)},
           {"schema", r.schema}};
  if (!r.only.empty()) run["--only"] = r.only;
  if (!r.attention_kernel.empty()) run["attention kernels"] = r.attention_kernel;
  if (const std::string timed = attention_kernels_timed(r); !timed.empty()) run["attention kernels timed"] = timed;
  if (const std::string fell = attention_fallbacks_timed(r); !fell.empty()) run["attention fallbacks"] = fell;
  s += kv_table(run, {"started (UTC)", "duration", "preset", "backend", "attention kernels", "attention kernels timed",
                      "attention fallbacks", "seed", "--only", "schema"});
  s += "</div></div></section>";
  return s;
}

// ---- Run record ---------------------------------------------------------------------------------

std::string run_section(const Results& r) {
  std::string s = section_open("run", "Run record",
                               "What ran, how long it took against what headroom list expects of it, and every sweep point "
                               "that did not run, with its reason.");
  if (r.incomplete) {
    std::string names;
    for (const auto& id : r.not_run) names += (names.empty() ? "" : ", ") + esc(id);
    s += fmt::format(R"(<p class="warn"><b>Interrupted.</b> {} propert{} and sweeps did not run: {}. )"
                     R"(<code>headroom run --resume DIR</code> runs them and keeps what finished.</p>)",
                     r.not_run.size(), r.not_run.size() == 1 ? "y" : "ies", names.empty() ? "none named" : names);
  }
  for (const auto& t : r.timings)
    if (!t.skipped.empty())
      s += fmt::format(R"(<p class="warn"><b>Skipped here:</b> {} ({}): {}</p>)", esc(t.id), esc(t.kind),
                       esc(t.skipped));
  {
    int oom = 0, errors = 0;
    for (const auto& p : r.sweep_points) {
      oom += p.status == "out_of_memory";
      errors += p.status == "error";
    }
    if (oom + errors > 0)
      s += fmt::format(R"(<p>Recovered in the run: {} sweep point{} that did not fit (recorded as out of memory, )"
                       R"(memory released, the sweep went on) and {} that failed (recorded as errors, the rest )"
                       R"(continued).</p>)",
                       oom, oom == 1 ? "" : "s", errors);
  }
  if (r.timings.empty()) {
    s += not_measured("no timing record (the file predates it or ran nothing)");
  } else {
    // Expected: what `headroom list` and the progress line expect of each entry at
    // the run's preset and backend (measured costs where there are some).
    std::optional<ExpectedCosts> costs;
    if ((r.preset == "quick" || r.preset == "full") && (r.backend == "cpu" || r.backend == "cuda"))
      costs = expected_costs(parse_preset(r.preset), r.backend == "cuda" ? BackendKind::cuda : BackendKind::cpu);
    s += fmt::format(R"(<table><thead><tr><th>Kind</th><th>ID</th><th>Title</th><th class="num">Seconds</th><th class="num" title="as headroom list expects it of the {} preset on {}">Expected</th><th class="num">Items</th><th>Error</th></tr></thead><tbody>)",
                     esc(r.preset), esc(r.backend));
    for (const auto& t : r.timings)
      s += fmt::format(R"(<tr><td>{}</td><td><b>{}</b></td><td>{}</td><td class="num">{:.2f}</td><td class="num">{:.1f}</td><td class="num">{}</td><td>{}</td></tr>)",
                       esc(t.kind), esc(t.id), esc(t.title), t.seconds,
                       costs ? costs->seconds(t.kind, t.id, t.expected_seconds_quick) : t.expected_seconds_quick,
                       t.items, esc(t.error));
    s += "</tbody></table>";
  }
  std::vector<const SweepPoint*> not_run;
  for (const auto& p : r.sweep_points)
    if (!is_ok(p)) not_run.push_back(&p);
  if (!not_run.empty()) {
    s += fmt::format(R"(<h3>Sweep points that did not run ({})</h3><table><thead><tr><th>Sweep</th><th>Backend</th><th>dtype</th><th>Model</th><th>Config</th><th>Status</th><th>Reason</th></tr></thead><tbody>)",
                     not_run.size());
    for (const auto* p : not_run)
      s += fmt::format(R"(<tr><td><b>{}</b></td><td>{}</td><td>{}</td><td>{}</td><td class="mono">{}</td><td><span class="badge {}">{}</span></td><td>{}</td></tr>)",
                       esc(p->sweep), esc(p->backend), esc(p->dtype), esc(p->model), esc(config_label(p->config)),
                       p->status == "error" ? "b-bad" : "b-warn", esc(p->status), esc(p->reason));
    s += "</tbody></table>";
  }
  return s + "</section>";
}

}  // namespace hr::report::detail
