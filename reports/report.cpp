// The HTML report, section by section: summary, device and build, conformance
// matrix, memory by consumer, curves, trade table, baseline verdict, run record.
// Each section reads only the Results; a section without data says so.
#include "reports/report.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <set>

#include "harness/fit.hpp"
#include "harness/memory.hpp"
#include "reports/html.hpp"
#include "reports/svg.hpp"

namespace hr::report {

namespace {

using nlohmann::json;

// ---- Small readers ---------------------------------------------------------------

std::optional<double> num_of(const json& j, std::initializer_list<const char*> keys) {
  if (!j.is_object()) return std::nullopt;
  for (const char* k : keys) {
    auto it = j.find(k);
    if (it == j.end()) continue;
    if (it->is_number()) return it->get<double>();
    if (it->is_string()) {
      try {
        return json_to_double(*it);
      } catch (...) {
      }
    }
  }
  return std::nullopt;
}

std::string str_of(const json& j, const char* key) {
  if (!j.is_object()) return "";
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return "";
  return it->is_string() ? it->get<std::string>() : it->dump();
}

// Catalogue order of the field guide (PROPERTIES.md), then the number.
std::pair<int, int> id_order(const std::string& id) {
  static const char* families[] = {"OPS", "DET", "GA", "BN", "CK", "MP", "PK", "Q8", "LR", "MEM", "BM", "TRADE"};
  const auto dash = id.find('-');
  const std::string fam = id.substr(0, dash);
  int f = 100;
  for (int i = 0; i < static_cast<int>(std::size(families)); ++i)
    if (fam == families[i]) f = i;
  int n = 0;
  if (dash != std::string::npos) {
    try {
      n = std::stoi(id.substr(dash + 1));
    } catch (...) {
      n = 0;
    }
  }
  return {f, n};
}

int dtype_order(const std::string& d) {
  if (d == "fp32") return 0;
  if (d == "fp16") return 1;
  if (d == "bf16") return 2;
  if (d.empty()) return 9;
  return 5;
}

bool is_ok(const SweepPoint& p) { return p.status == "ok"; }

// ---- Page frame ------------------------------------------------------------------

const char* kCss = R"CSS(
:root{--ink:#0f172a;--muted:#64748b;--line:#e2e8f0;--bg:#f8fafc;--ok:#15803d;--okbg:#dcfce7;--bad:#b91c1c;--badbg:#fee2e2;
--neg:#1d4ed8;--negbg:#dbeafe;--warn:#a16207;--warnbg:#fef9c3;--na:#94a3b8}
*{box-sizing:border-box}
body{margin:0;background:var(--bg);color:var(--ink);font:14px/1.5 system-ui,-apple-system,"Segoe UI",Roboto,Helvetica,Arial,sans-serif}
header.top{background:linear-gradient(120deg,#0f172a,#1e3a5f);color:#fff;padding:28px 0 22px}
header.top .wrap{display:flex;justify-content:space-between;align-items:flex-end;gap:24px;flex-wrap:wrap}
header.top h1{margin:0;font-size:26px;letter-spacing:.2px}
header.top h1 small{font-weight:400;color:#cbd5e1;font-size:15px;margin-left:10px}
header.top .sub{color:#cbd5e1;margin-top:6px}
.wrap{max-width:1220px;margin:0 auto;padding:0 24px}
nav.toc{background:#fff;border-bottom:1px solid var(--line);position:sticky;top:0;z-index:2}
nav.toc .wrap{display:flex;gap:18px;flex-wrap:wrap;padding-top:9px;padding-bottom:9px}
nav.toc a{color:#334155;text-decoration:none;font-size:13px}
nav.toc a:hover{color:#0369a1}
section{background:#fff;border:1px solid var(--line);border-radius:10px;margin:20px 0;padding:18px 22px 20px}
section h2{margin:0 0 4px;font-size:19px}
section h3{margin:18px 0 6px;font-size:15px}
p.lead{margin:0 0 14px;color:var(--muted)}
.cards{display:grid;grid-template-columns:repeat(auto-fit,minmax(170px,1fr));gap:12px}
.card{border:1px solid var(--line);border-radius:8px;padding:12px 14px;background:#fff}
.card .k{color:var(--muted);font-size:12px;text-transform:uppercase;letter-spacing:.6px}
.card .v{font-size:24px;font-weight:650;margin-top:2px}
.card .s{color:var(--muted);font-size:12px}
.card.ok{border-color:#86efac;background:#f0fdf4}.card.bad{border-color:#fca5a5;background:#fef2f2}
table{border-collapse:collapse;width:100%;font-size:13px}
th,td{padding:5px 9px;border-bottom:1px solid var(--line);text-align:left;vertical-align:top}
th{background:#f1f5f9;color:#334155;font-weight:600;position:sticky;top:38px}
td.num,th.num{text-align:right;font-variant-numeric:tabular-nums}
th.mid{text-align:center}
.nw{white-space:nowrap}
tbody tr:nth-child(even) td{background:#fbfdff}
table.kv td:first-child{color:var(--muted);width:38%}
.two{display:grid;grid-template-columns:1fr 1fr;gap:22px}
@media (max-width:900px){.two{grid-template-columns:1fr}}
.charts{display:flex;flex-wrap:wrap;gap:18px}
.chart{background:#fff;max-width:100%}
.badge{display:inline-block;padding:1px 8px;border-radius:999px;font-size:12px;font-weight:600}
.b-ok{background:var(--okbg);color:var(--ok)}.b-bad{background:var(--badbg);color:var(--bad)}
.b-neg{background:var(--negbg);color:var(--neg)}.b-warn{background:var(--warnbg);color:var(--warn)}
.b-na{background:#f1f5f9;color:var(--muted)}
table.matrix td.cell{text-align:center;white-space:nowrap;font-variant-numeric:tabular-nums}
td.cell.ok{background:#f0fdf4!important;color:var(--ok)}td.cell.bad{background:#fef2f2!important;color:var(--bad);font-weight:650}
td.cell.neg{background:#eff6ff!important;color:var(--neg)}td.cell.na{color:var(--na)}
td.cell small{display:block;color:var(--muted);font-size:11px}
.empty{border:1px dashed #cbd5e1;border-radius:8px;padding:14px 16px;color:var(--muted);background:var(--bg)}
.verdict{border-radius:10px;padding:14px 18px;margin:6px 0 14px;font-size:16px}
.verdict.fit{background:var(--okbg);color:#14532d;border:1px solid #86efac}
.verdict.notfit{background:var(--badbg);color:#7f1d1d;border:1px solid #fca5a5}
.verdict strong{font-size:20px;margin-right:8px}
ul.reasons{margin:6px 0 0 0;padding-left:20px}
ul.warn li,p.warn{color:var(--warn)}
code,.mono{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:12px}
details>summary{cursor:pointer;color:#0369a1;margin:10px 0 6px}
.bar{height:10px;border-radius:3px;background:#0072B2;display:inline-block;vertical-align:middle}
footer{color:var(--muted);font-size:12px;text-align:center;padding:10px 0 30px}
)CSS";

std::string section_open(const char* id, const std::string& title, const std::string& lead) {
  std::string s = fmt::format(R"(<section id="{}"><h2>{}</h2>)", id, esc(title));
  if (!lead.empty()) s += fmt::format(R"(<p class="lead">{}</p>)", lead);  // lead is trusted text
  return s;
}

std::string not_measured(const std::string& what) {
  return fmt::format(R"(<div class="empty">Not measured in this run: {}.</div>)", esc(what));
}

// ---- Summary -------------------------------------------------------------------------

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
  s += R"(</div></section>)";
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
  s += kv_table(run, {"started (UTC)", "duration", "preset", "backend", "seed", "--only", "schema"});
  s += "</div></div></section>";
  return s;
}

// ---- Conformance -----------------------------------------------------------------------

// How far inside its bound a measurement is: tolerance / error for a check (inf when
// exact), error / tolerance for a negative control (how clearly it was caught).
double headroom_ratio(const Measurement& m) {
  if (is_error_measurement(m)) return std::nan("");
  if (!m.negative_control) {
    if (m.error == 0) return INFINITY;
    return m.tolerance / m.error;
  }
  if (m.tolerance == 0) return m.error > 0 ? INFINITY : 0.0;
  return m.error / m.tolerance;
}

std::string ratio_text(double h) {
  if (std::isnan(h)) return "-";
  if (std::isinf(h)) return h > 0 ? "exact" : "-inf";
  if (h >= 1e5) return fmt::format("{:.2g}x", h);
  if (h >= 100) return fmt::format("{:.0f}x", h);
  return fmt::format("{:.2g}x", h);
}

std::string status_badge(const Measurement& m) {
  if (is_error_measurement(m)) return R"(<span class="badge b-bad">error</span>)";
  if (m.negative_control) return m.passed ? R"(<span class="badge b-neg">caught</span>)"
                                          : R"(<span class="badge b-bad">not caught</span>)";
  return m.passed ? R"(<span class="badge b-ok">pass</span>)" : R"(<span class="badge b-bad">fail</span>)";
}

// A property's power over the measurements of one (backend, dtype) cell, or over the
// whole row when both are empty: the smallest error / bound among its caught controls.
struct PropertyPower {
  std::optional<double> power;
  int controls = 0, subtle_caught = 0;
};

PropertyPower property_power(const std::vector<Measurement>& ms, const std::string& id, const std::string& backend,
                             const std::string& dtype) {
  PropertyPower p;
  for (const auto& m : ms) {
    if (m.id != id || !m.negative_control) continue;
    if (!backend.empty() && (m.backend != backend || m.dtype != dtype)) continue;
    ++p.controls;
    if (!m.passed || !m.power) continue;
    if (m.control == "subtle") ++p.subtle_caught;
    if (!p.power || *m.power < *p.power) p.power = *m.power;
  }
  return p;
}

std::string conformance_section(const Results& r) {
  std::string s = section_open(
      "conformance", "Conformance",
      "Each property (PROPERTIES.md) by backend and dtype. A cell shows the worst case over its configurations: "
      "<b>headroom</b> is tolerance / error for a check (how far inside its bound it stayed; <i>exact</i> = zero "
      "error) and error / tolerance for a negative control (the broken variant, which must be caught). "
      "<b>Power</b> is the smallest injected error the property's checks caught, relative to their bound: "
      "a power of 20x means a fault 20 times the bound was seen. Every property carries a <i>subtle</i> "
      "control (within 100x of its bound) beside the gross failure mode.");
  if (r.measurements.empty()) {
    s += not_measured("no property measurements in the results");
    return s + "</section>";
  }
  // Columns: (backend, dtype) present; rows: ids in catalogue order.
  std::set<std::pair<std::string, std::string>> col_set;
  std::map<std::string, std::string> titles;
  for (const auto& m : r.measurements) {
    col_set.insert({m.backend, m.dtype});
    if (!titles.count(m.id) || titles[m.id].empty()) titles[m.id] = m.title;
  }
  // A property's own title (from the run record) names the row better than the
  // title of whichever of its measurements came first.
  for (const auto& t : r.timings)
    if (t.kind == "property" && titles.count(t.id) && !t.title.empty()) titles[t.id] = t.title;
  std::vector<std::pair<std::string, std::string>> cols(col_set.begin(), col_set.end());
  std::sort(cols.begin(), cols.end(), [](const auto& a, const auto& b) {
    if (a.first != b.first) return a.first < b.first;
    return std::make_pair(dtype_order(a.second), a.second) < std::make_pair(dtype_order(b.second), b.second);
  });
  std::vector<std::string> ids;
  for (const auto& [id, _] : titles) ids.push_back(id);
  std::sort(ids.begin(), ids.end(), [](const std::string& a, const std::string& b) {
    return std::make_pair(id_order(a), a) < std::make_pair(id_order(b), b);
  });

  // Failures first, so they cannot be missed.
  std::vector<const Measurement*> failed;
  for (const auto& m : r.measurements)
    if (!m.passed) failed.push_back(&m);
  if (!failed.empty()) {
    s += fmt::format(R"(<h3>Failures ({})</h3><ul class="reasons">)", failed.size());
    for (const auto* m : failed) {
      std::string why = is_error_measurement(*m)
                            ? "threw: " + m->details.value("error", std::string())
                            : (m->negative_control ? fmt::format("negative control not caught: {} {} <= {}", m->metric,
                                                                 fmt_num(m->error), fmt_num(m->tolerance))
                                                   : fmt::format("{} {} exceeds the tolerance {}", m->metric,
                                                                 fmt_num(m->error), fmt_num(m->tolerance)));
      s += fmt::format("<li><b>{}</b> {} {} {} {}: {}</li>", esc(m->id), esc(m->backend), esc(m->dtype),
                       esc(m->model), esc(config_label(m->config)), esc(why));
    }
    s += "</ul>";
  }

  s += R"(<h3>Matrix</h3><table class="matrix"><thead><tr><th>Property</th>)";
  for (const auto& [b, d] : cols)
    s += fmt::format(R"(<th class="mid">{}<br><span class="mono">{}</span></th>)", esc(b), esc(d.empty() ? "-" : d));
  s += R"(<th class="mid">Power<br><span class="mono">smallest caught</span></th>)";
  s += "</tr></thead><tbody>";
  for (const auto& id : ids) {
    s += fmt::format("<tr><td><b>{}</b> {}</td>", esc(id), esc(titles[id]));
    const PropertyPower row_power = property_power(r.measurements, id, "", "");
    for (const auto& [b, d] : cols) {
      std::vector<const Measurement*> cell;
      for (const auto& m : r.measurements)
        if (m.id == id && m.backend == b && m.dtype == d) cell.push_back(&m);
      if (cell.empty()) {
        s += R"(<td class="cell na">&middot;</td>)";
        continue;
      }
      int fails = 0, negs = 0;
      double worst = INFINITY;
      const Measurement* worst_m = cell.front();
      std::string tip;
      for (const auto* m : cell) {
        if (!m->passed) ++fails;
        if (m->negative_control) ++negs;
        // The cell shows a failure if there is one, else the smallest headroom.
        const double h = headroom_ratio(*m);
        if (!m->passed) {
          if (worst_m->passed || is_error_measurement(*m)) worst_m = m;
        } else if (worst_m->passed && !std::isnan(h) && !m->negative_control && h <= worst) {
          worst = h, worst_m = m;  // a check's headroom; negative controls are counted below
        }
        tip += fmt::format("{}{} {}: {} = {} (tolerance {}){}\n", m->negative_control ? "[negative control] " : "",
                           m->model, config_label(m->config), m->metric, fmt_num(m->error), fmt_num(m->tolerance),
                           m->passed ? "" : " FAILED");
      }
      const bool all_neg = negs == static_cast<int>(cell.size());
      if (all_neg && !fails) {  // the least clearly caught control
        worst = INFINITY;
        for (const auto* m : cell) worst = std::min(worst, headroom_ratio(*m));
      }
      const char* cls = fails ? "bad" : (all_neg ? "neg" : "ok");
      std::string main;
      if (fails) {
        main = is_error_measurement(*worst_m) ? "error" : fmt::format("&#10007; {}", esc(ratio_text(headroom_ratio(*worst_m))));
      } else if (all_neg) {
        main = fmt::format("caught {}", esc(ratio_text(worst)));
      } else {
        main = fmt::format("&#10003; {}", esc(ratio_text(worst)));
      }
      std::string sub = fmt::format("{} check{}", cell.size(), cell.size() == 1 ? "" : "s");
      if (fails) sub = fmt::format("{} of {} failed", fails, cell.size());
      else if (negs && !all_neg) sub += fmt::format(", {} caught", negs);
      const PropertyPower cell_power = property_power(r.measurements, id, b, d);
      if (cell_power.power) sub += fmt::format(", power {}", ratio_text(*cell_power.power));
      s += fmt::format(R"(<td class="cell {}" title="{}">{}<small>{}</small></td>)", cls, esc(tip), main, esc(sub));
    }
    if (row_power.power) {
      s += fmt::format(R"(<td class="cell {}">{}<small>{} subtle of {} controls caught</small></td>)",
                       row_power.subtle_caught > 0 ? "neg" : "bad", esc(ratio_text(*row_power.power)),
                       row_power.subtle_caught, row_power.controls);
    } else {
      s += fmt::format(R"(<td class="cell bad">none<small>{} controls, none caught</small></td>)", row_power.controls);
    }
    s += "</tr>";
  }
  s += "</tbody></table>";

  // Every measurement, in catalogue order.
  std::vector<const Measurement*> all;
  for (const auto& m : r.measurements) all.push_back(&m);
  std::stable_sort(all.begin(), all.end(), [](const Measurement* a, const Measurement* b) {
    return std::make_pair(id_order(a->id), a->id) < std::make_pair(id_order(b->id), b->id);
  });
  s += fmt::format(R"(<details{}><summary>All {} measurements: error against tolerance</summary>)",
                   all.size() <= 40 ? " open" : "", all.size());
  s += R"(<table><thead><tr><th>ID</th><th>Backend</th><th>dtype</th><th>Model</th><th>Config</th><th>Metric</th>)"
       R"(<th class="num">Error</th><th class="num">Tolerance</th><th class="num">Headroom</th><th>Control</th><th>Result</th><th>Tolerance from</th></tr></thead><tbody>)";
  for (const auto* m : all) {
    s += fmt::format(
        R"(<tr><td class="nw"><b>{}</b></td><td>{}</td><td>{}</td><td>{}</td><td class="mono">{}</td><td>{}</td><td class="num">{}</td><td class="num nw">{}{}</td><td class="num">{}</td><td>{}</td><td>{}</td><td>{}</td></tr>)",
        esc(m->id), esc(m->backend), esc(m->dtype), esc(m->model), esc(config_label(m->config)), esc(m->metric),
        esc(fmt_num(m->error)), m->negative_control ? "&gt; " : "&le; ", esc(fmt_num(m->tolerance)),
        esc(ratio_text(headroom_ratio(*m))), esc(m->control.empty() ? "-" : m->control), status_badge(*m),
        esc(is_error_measurement(*m) ? m->details.value("error", std::string()) : m->tolerance_reason));
  }
  s += "</tbody></table></details></section>";
  return s;
}

// ---- Series from sweep points ----------------------------------------------------------

std::string series_label_of(const SweepPoint& p, const std::vector<std::string>& varying_fields,
                            const std::set<std::string>& varying_keys) {
  std::string s;
  auto add = [&](const std::string& part) {
    if (part.empty()) return;
    if (!s.empty()) s += " ";
    s += part;
  };
  for (const auto& f : varying_fields) {
    if (f == "sweep") add(p.sweep);
    if (f == "backend") add(p.backend);
    if (f == "dtype") add(p.dtype);
    if (f == "model") add(p.model);
  }
  for (const auto& k : varying_keys)
    if (p.config.contains(k)) add(k + "=" + (p.config[k].is_string() ? p.config[k].get<std::string>() : p.config[k].dump()));
  if (s.empty()) {  // nothing varies: name the one series by what it is
    for (const auto* part : {&p.model, &p.dtype, &p.backend}) add(*part);
  }
  return s.empty() ? "all" : s;
}

// Groups points into series: one series per distinct (sweep, backend, dtype, model,
// config without the x key and the ignored keys). Labels name only what varies.
std::vector<Series> make_series(const std::vector<const SweepPoint*>& pts, std::initializer_list<const char*> x_keys,
                                const std::set<std::string>& ignore,
                                const std::function<std::optional<double>(const SweepPoint&)>& y_of) {
  std::set<std::string> x_set(x_keys.begin(), x_keys.end());
  auto rest_of = [&](const SweepPoint& p) {
    json rest = json::object();
    for (auto it = p.config.begin(); it != p.config.end(); ++it)
      if (!x_set.count(it.key()) && !ignore.count(it.key())) rest[it.key()] = *it;
    return rest;
  };
  std::map<std::string, std::set<std::string>> field_values;
  std::map<std::string, std::set<std::string>> key_values;
  for (const auto* p : pts) {
    field_values["sweep"].insert(p->sweep);
    field_values["backend"].insert(p->backend);
    field_values["dtype"].insert(p->dtype);
    field_values["model"].insert(p->model);
    const json rest = rest_of(*p);
    for (auto it = rest.begin(); it != rest.end(); ++it) key_values[it.key()].insert(it->dump());
  }
  std::vector<std::string> varying_fields;
  for (const char* f : {"sweep", "model", "backend", "dtype"})
    if (field_values[f].size() > 1) varying_fields.push_back(f);
  std::set<std::string> varying_keys;
  for (const auto& [k, vals] : key_values)
    if (vals.size() > 1) varying_keys.insert(k);

  std::vector<Series> out;
  std::map<std::string, size_t> index;
  for (const auto* p : pts) {
    const auto x = num_of(p->config, x_keys);
    const auto y = y_of(*p);
    if (!x || !y) continue;
    const std::string key = p->sweep + "|" + p->backend + "|" + p->dtype + "|" + p->model + "|" + rest_of(*p).dump();
    auto it = index.find(key);
    if (it == index.end()) {
      it = index.emplace(key, out.size()).first;
      out.push_back(Series{series_label_of(*p, varying_fields, varying_keys), {}, "", false});
    }
    out[it->second].points.emplace_back(*x, *y);
  }
  return out;
}

std::vector<const SweepPoint*> points_of(const Results& r, std::initializer_list<const char*> sweeps) {
  std::vector<const SweepPoint*> v;
  for (const auto& p : r.sweep_points)
    for (const char* s : sweeps)
      if (p.sweep == s && is_ok(p)) v.push_back(&p);
  return v;
}

std::optional<double> activation_peak(const SweepPoint& p) {
  const double v = static_cast<double>(p.memory.peak(Consumer::activations));
  if (v > 0) return v;
  if (auto m = num_of(p.metrics, {"activation_peak_bytes", "activations_peak_bytes"})) return m;
  return std::nullopt;
}

// The fitted exponent of each series (harness/fit.hpp), in its legend.
void add_exponents(std::vector<Series>& series) {
  for (auto& s : series) {
    std::vector<double> x, y;
    for (const auto& [px, py] : s.points)
      if (px > 0 && py > 0 && std::isfinite(px) && std::isfinite(py)) x.push_back(px), y.push_back(py);
    if (x.size() < 2 || std::set<double>(x.begin(), x.end()).size() < 2) continue;
    s.name += fmt::format(" (exponent {:.2f})", fit_power_law(x, y).exponent);
  }
}

// ---- Memory by consumer ----------------------------------------------------------------

const std::vector<std::string>& consumer_colors() {
  static const std::vector<std::string> c = {"#4E79A7", "#F28E2B", "#E15759", "#59A14F", "#B0A9A3"};
  return c;
}

std::string memory_section(const Results& r) {
  std::string s = section_open("memory", "Memory by consumer",
                               "Peak bytes per consumer, as the tracking allocator measured them for each "
                               "configuration: weights, gradients, optimizer state, activations kept for the "
                               "backward pass, and workspace. Each consumer's peak is its own high-water mark.");
  std::vector<std::string> sweeps;
  for (const auto& p : r.sweep_points)
    if (is_ok(p) && p.memory.total_peak_bytes > 0 && std::find(sweeps.begin(), sweeps.end(), p.sweep) == sweeps.end())
      sweeps.push_back(p.sweep);
  if (sweeps.empty()) {
    s += not_measured("no sweep point recorded memory");
    return s + "</section>";
  }
  std::vector<std::string> names;
  for (Consumer c : kAllConsumers) names.push_back(consumer_name(c));
  s += R"(<div class="charts">)";
  constexpr size_t kMaxBars = 24;
  for (const auto& sw : sweeps) {
    std::vector<const SweepPoint*> pts;
    for (const auto& p : r.sweep_points)
      if (p.sweep == sw && is_ok(p) && p.memory.total_peak_bytes > 0) pts.push_back(&p);
    std::set<std::string> dt, md, be;
    for (const auto* p : pts) dt.insert(p->dtype), md.insert(p->model), be.insert(p->backend);
    // Label bars by the config keys that vary within the sweep (all, when none varies).
    std::map<std::string, std::set<std::string>> key_values;
    for (const auto* p : pts)
      for (auto it = p->config.begin(); it != p->config.end(); ++it) key_values[it.key()].insert(it->dump());
    auto varying_label = [&](const json& config) {
      json v = json::object();
      for (auto it = config.begin(); it != config.end(); ++it)
        if (key_values[it.key()].size() > 1) v[it.key()] = *it;
      return config_label(v.empty() ? config : v);
    };
    std::vector<Bar> bars;
    for (size_t i = 0; i < pts.size() && i < kMaxBars; ++i) {
      const auto* p = pts[i];
      std::string label;
      for (const auto& [set, v] : {std::make_pair(&md, p->model), std::make_pair(&be, p->backend),
                                   std::make_pair(&dt, p->dtype)})
        if (set->size() > 1 && !v.empty()) label += (label.empty() ? "" : " ") + v;
      // A named step (TRADE) reads better by its name than by its config.
      const std::string technique = str_of(p->config, "technique");
      const std::string cfg = technique.empty() ? varying_label(p->config) : technique;
      if (!cfg.empty()) label += (label.empty() ? "" : " ") + cfg;
      Bar b{label.empty() ? std::to_string(i + 1) : label, {}};
      for (Consumer c : kAllConsumers) b.values.push_back(static_cast<double>(p->memory.peak(c)));
      bars.push_back(std::move(b));
    }
    ChartOptions o;
    o.title = sw + (pts.size() > kMaxBars ? fmt::format(" (first {} of {})", kMaxBars, pts.size()) : "");
    o.y_label = "peak bytes";
    o.y_format = AxisFormat::bytes;
    o.width = 550;
    s += stacked_bar_chart(names, consumer_colors(), bars, o);
  }
  s += "</div></section>";
  return s;
}

// ---- Curves -------------------------------------------------------------------------------

std::string curve_bm_mb(const Results& r) {
  std::string s = section_open("curve-bm-mb", "Micro-batch size (BM-MB)",
                               "At a fixed effective batch, smaller micro-batches hold fewer activations but keep "
                               "the device less busy: throughput and peak bytes against the micro-batch size.");
  const auto pts = points_of(r, {"BM-MB"});
  if (pts.empty()) return s + not_measured("no BM-MB sweep points") + "</section>";
  std::string unit = "steps/s";
  for (const auto* p : pts) {
    if (p->metrics.contains("tokens_per_s")) { unit = "tokens/s"; break; }
    if (p->metrics.contains("samples_per_s")) unit = "samples/s";
  }
  auto thr = [&](const SweepPoint& p) -> std::optional<double> {
    if (unit == "tokens/s") return num_of(p.metrics, {"tokens_per_s"});
    if (unit == "samples/s") return num_of(p.metrics, {"samples_per_s"});
    if (p.time && p.time->median_s > 0) return 1.0 / p.time->median_s;
    return std::nullopt;
  };
  const std::set<std::string> ignore = {"accum_steps"};
  auto t_series = make_series(pts, {"micro_batch"}, ignore, thr);
  auto m_series = make_series(pts, {"micro_batch"}, ignore, [](const SweepPoint& p) -> std::optional<double> {
    return p.memory.total_peak_bytes > 0 ? std::optional<double>(static_cast<double>(p.memory.total_peak_bytes))
                                         : std::nullopt;
  });
  ChartOptions a;
  a.title = "Throughput";
  a.x_label = "micro-batch size";
  a.y_label = unit;
  a.log_x = true;
  ChartOptions b = a;
  b.title = "Peak bytes (all consumers)";
  b.y_label = "peak bytes";
  b.y_format = AxisFormat::bytes;
  s += R"(<div class="charts">)" + line_chart(t_series, a) + line_chart(m_series, b) + "</div>";

  // Per-sample throughput relative to the largest micro-batch of the same series.
  s += R"(<details><summary>Table: throughput relative to the largest micro-batch</summary><table><thead><tr>)"
       R"(<th>Series</th><th class="num">Micro-batch</th><th class="num">Step time</th><th class="num">)" +
       esc(unit) + R"(</th><th class="num">Relative</th><th class="num">Peak bytes</th>)"
       R"(<th class="num">Host waits per step</th></tr></thead><tbody>)";
  for (const auto& ser : t_series) {
    if (ser.points.empty()) continue;
    auto best = *std::max_element(ser.points.begin(), ser.points.end());
    for (auto [x, y] : ser.points) {
      const SweepPoint* pp = nullptr;
      for (const auto* p : pts) {
        auto px = num_of(p->config, {"micro_batch"});
        auto py = thr(*p);
        if (px && *px == x && py && *py == y) pp = p;
      }
      const std::optional<double> waits = pp ? num_of(pp->metrics, {"host_syncs_per_step"}) : std::nullopt;
      s += fmt::format(R"(<tr><td>{}</td><td class="num">{}</td><td class="num">{}</td><td class="num">{}</td><td class="num">{:.2f}</td><td class="num">{}</td><td class="num">{}</td></tr>)",
                       esc(ser.name), esc(fmt_num(x)), esc(pp && pp->time ? fmt_seconds(pp->time->median_s) : "-"),
                       esc(fmt_si(y)), best.second > 0 ? y / best.second : 0.0,
                       esc(pp ? fmt_bytes_short(static_cast<double>(pp->memory.total_peak_bytes)) : "-"),
                       esc(waits ? fmt_num(*waits) : "-"));
    }
  }
  s += "</tbody></table></details></section>";
  return s;
}

std::string curve_ck3(const Results& r) {
  std::string s = section_open("curve-ck-3", "Activation peak against depth (CK-3)",
                               "Without checkpointing the activations kept grow linearly with depth (exponent ~1); "
                               "with sqrt(L) segments they grow like sqrt(L) (exponent &le; 0.65, Chen et al. 2016). "
                               "Exponents are least-squares fits on log-log axes.");
  const auto pts = points_of(r, {"CK-3"});
  if (pts.empty()) return s + not_measured("no CK-3 sweep points") + "</section>";
  auto series = make_series(pts, {"depth", "layers", "n_layers"}, {}, activation_peak);
  add_exponents(series);
  ChartOptions o;
  o.title = "Peak activation bytes";
  o.x_label = "depth (blocks)";
  o.y_label = "activation peak";
  o.log_x = o.log_y = true;
  o.y_format = AxisFormat::bytes;
  // Everything the pass allocated, workspace included (CK-3's pass peak): a saving
  // that only charged kept tensors to another consumer would not show here.
  auto pass = make_series(pts, {"depth", "layers", "n_layers"}, {}, [](const SweepPoint& p) {
    return num_of(p.metrics, {"pass_peak_bytes"});
  });
  add_exponents(pass);
  std::string charts = line_chart(series, o);
  if (!pass.empty()) {
    ChartOptions t = o;
    t.title = "Peak bytes of the pass (workspace included)";
    t.y_label = "pass peak";
    charts += line_chart(pass, t);
  }
  s += R"(<div class="charts">)" + charts + "</div>";

  // BM-CK: what each granularity costs in step time, beside what it saves.
  const auto bm = points_of(r, {"BM-CK"});
  if (bm.empty()) {
    s += "<p>Step time per granularity: BM-CK was not run.</p>";
  } else {
    s += R"(<table><thead><tr><th>Granularity</th><th class="num">Segment (blocks)</th><th class="num">Step time</th>)"
         R"(<th class="num">Overhead</th><th class="num">Activation peak</th><th class="num">Total peak</th>)"
         R"(</tr></thead><tbody>)";
    for (const auto* p : bm) {
      const auto ratio = num_of(p->metrics, {"overhead_ratio"});
      const auto act = num_of(p->metrics, {"activation_peak_bytes"});
      s += fmt::format(
          R"(<tr><td>{}</td><td class="num">{}</td><td class="num">{}</td><td class="num">{}</td><td class="num">{}</td><td class="num">{}</td></tr>)",
          esc(str_of(p->config, "checkpoint") + " (" + p->backend + " " + p->dtype + ")"),
          esc(fmt_num(num_of(p->config, {"every_k_blocks"}).value_or(0))),
          esc(p->time ? fmt_seconds(p->time->median_s) : "-"),
          esc(ratio ? fmt::format("{:+.0f}%", (*ratio - 1) * 100) : "-"),
          esc(act ? fmt_bytes_short(*act) : "-"), esc(fmt_bytes_short(static_cast<double>(p->memory.total_peak_bytes))));
    }
    s += "</tbody></table><p>Overhead: step time against no checkpointing on this device (Chen et al. 2016: ~30% "
         "for one extra forward; the field guide: 30-40%).</p>";
  }
  return s + "</section>";
}

std::string curve_seq(const Results& r) {
  std::string s = section_open("curve-seq", "Activation peak against sequence length (PK-4, BM-SEQ)",
                               "Naive attention materialises the T&times;T scores (exponent ~2); memory-efficient "
                               "attention keeps O(T) (exponent ~1; Rabe &amp; Staats 2021). Below: pad tokens per "
                               "batching strategy (PK-3) and what packing buys in useful tokens/s (BM-PK).");
  const auto pts = points_of(r, {"PK-4", "BM-SEQ"});
  if (pts.empty()) return s + not_measured("no PK-4 or BM-SEQ sweep points") + "</section>";
  auto series = make_series(pts, {"seq_len", "seq", "T"}, {}, activation_peak);
  add_exponents(series);
  ChartOptions o;
  o.title = "Peak activation bytes";
  o.x_label = "sequence length (tokens)";
  o.y_label = "activation peak";
  o.log_x = o.log_y = true;
  o.y_format = AxisFormat::bytes;
  std::string charts = line_chart(series, o);
  auto t_series = make_series(points_of(r, {"BM-SEQ"}), {"seq_len", "seq", "T"}, {},
                              [](const SweepPoint& p) -> std::optional<double> {
                                if (p.time && p.time->median_s > 0) return p.time->median_s;
                                return std::nullopt;
                              });
  if (!t_series.empty()) {
    ChartOptions t = o;
    t.title = "Step time";
    t.y_label = "step time";
    t.y_format = AxisFormat::seconds;
    charts += line_chart(t_series, t);
  }
  s += R"(<div class="charts">)" + charts + "</div>";

  // PK-3: the fraction of pad tokens per strategy and length distribution (the
  // check's details), one table per backend run.
  for (const Measurement& m : r.measurements) {
    if (m.id != "PK-3" || m.negative_control || !m.details.contains("pad_fraction")) continue;
    const auto& pf = m.details["pad_fraction"];
    if (!pf.is_object()) continue;
    s += fmt::format(R"(<h3>Pad tokens per strategy (PK-3, rows of {} tokens, batches of {})</h3>)",
                     esc(fmt_num(num_of(m.config, {"seq_len"}).value_or(0))),
                     esc(fmt_num(num_of(m.config, {"batch_rows"}).value_or(0))));
    s += R"(<table><thead><tr><th>Lengths</th><th class="num">Mean length</th><th class="num">Pad to max</th>)"
         R"(<th class="num">Pad to longest</th><th class="num">Bucketed</th><th class="num">Packed</th></tr></thead><tbody>)";
    for (const auto& [dist, v] : pf.items()) {
      auto pct = [&](const char* k) {
        const auto x = num_of(v, {k});
        return x ? fmt::format("{:.1f}%", *x * 100) : std::string("-");
      };
      s += fmt::format(
          R"(<tr><td>{}</td><td class="num">{}</td><td class="num">{}</td><td class="num">{}</td><td class="num">{}</td><td class="num">{}</td></tr>)",
          esc(dist), esc(fmt::format("{:.0f}", num_of(v, {"mean_length"}).value_or(0))), esc(pct("pad_to_max")),
          esc(pct("pad_to_longest")), esc(pct("bucketed")), esc(pct("packed")));
    }
    s += "</tbody></table><p>Anchor: Krell et al. 2021, up to 50% padding on Wikipedia at 512; first-fit-decreasing "
         "packing removes nearly all of it.</p>";
    break;
  }

  // BM-PK: useful (non-pad) tokens/s per strategy on the long tail.
  const auto bm = points_of(r, {"BM-PK"});
  if (!bm.empty()) {
    s += R"(<h3>Useful tokens per second (BM-PK)</h3><table><thead><tr><th>Strategy</th><th class="num">Pad tokens</th>)"
         R"(<th class="num">Useful tokens/s</th><th class="num">Against pad-to-max</th><th class="num">Activation peak</th>)"
         R"(</tr></thead><tbody>)";
    for (const auto* p : bm) {
      const auto pad = num_of(p->metrics, {"pad_fraction"});
      const auto tps = num_of(p->metrics, {"useful_tokens_per_s"});
      const auto rel = num_of(p->metrics, {"useful_throughput_vs_pad_to_max"});
      const auto act = num_of(p->metrics, {"activation_peak_bytes"});
      s += fmt::format(
          R"(<tr><td>{}</td><td class="num">{}</td><td class="num">{}</td><td class="num">{}</td><td class="num">{}</td></tr>)",
          esc(str_of(p->config, "strategy") + " (" + p->backend + " " + p->dtype + ")"),
          esc(pad ? fmt::format("{:.1f}%", *pad * 100) : "-"), esc(tps ? fmt::format("{:.0f}", *tps) : "-"),
          esc(rel ? fmt::format("{:.2f}x", *rel) : "-"), esc(act ? fmt_bytes_short(*act) : "-"));
    }
    s += "</tbody></table>";
  }
  s += "</section>";
  return s;
}

std::string curve_q83(const Results& r) {
  std::string s = section_open("curve-q8-3", "8-bit against fp32 optimizer state (Q8-3)",
                               "Long horizon without resynchronising: the loss of 8-bit Adam against fp32 Adam on "
                               "the same problem. The drift is what accumulates from quantising the moments.");
  std::vector<Series> series;
  const auto pts = points_of(r, {"Q8-3"});
  if (!pts.empty())
    series = make_series(pts, {"step"}, {}, [](const SweepPoint& p) { return num_of(p.metrics, {"loss"}); });
  std::string x_label = "step", y_label = "loss";
  if (series.empty()) {
    for (const auto& m : r.measurements) {
      if (m.id != "Q8-3" || !m.details.contains("curve")) continue;
      const auto& c = m.details["curve"];
      if (!c.is_object() || !c.contains("x") || !c.contains("series") || !c["x"].is_array() || !c["series"].is_object())
        continue;
      x_label = str_of(c, "x_label").empty() ? x_label : str_of(c, "x_label");
      y_label = str_of(c, "y_label").empty() ? y_label : str_of(c, "y_label");
      for (auto it = c["series"].begin(); it != c["series"].end(); ++it) {
        Series ser{it.key(), {}, "", false};
        if (!it->is_array()) continue;
        for (size_t i = 0; i < it->size() && i < c["x"].size(); ++i) {
          try {
            ser.points.emplace_back(json_to_double(c["x"][i]), json_to_double((*it)[i]));
          } catch (...) {
          }
        }
        series.push_back(std::move(ser));
      }
      break;
    }
  }
  if (series.empty()) return s + not_measured("no Q8-3 drift curve") + "</section>";
  ChartOptions o;
  o.title = "Loss over steps";
  o.x_label = x_label;
  o.y_label = y_label;
  std::string charts = line_chart(series, o);
  // The drift: each other series relative to the first (the fp32 reference when
  // the sweep lists it first), at the steps both have.
  if (series.size() >= 2) {
    std::map<double, double> ref(series[0].points.begin(), series[0].points.end());
    std::vector<Series> drift;
    for (size_t i = 1; i < series.size(); ++i) {
      Series d{series[i].name + " vs " + series[0].name, {}, palette()[i % palette().size()], false};
      for (const auto& [x, y] : series[i].points) {
        auto it = ref.find(x);
        if (it != ref.end() && it->second != 0) d.points.emplace_back(x, (y / it->second - 1.0) * 100.0);
      }
      drift.push_back(std::move(d));
    }
    ChartOptions dopt = o;
    dopt.title = "Drift (relative difference of " + y_label + ", %)";
    dopt.y_label = "% difference";
    charts += line_chart(drift, dopt);
  }
  s += R"(<div class="charts">)" + charts + "</div>";
  for (const auto& m : r.measurements)
    if (m.id == "Q8-3" && m.metric != "exception")
      s += fmt::format(R"(<p>Final-loss difference: {} {} (tolerance {}) {}</p>)", esc(m.metric), esc(fmt_num(m.error)),
                       esc(fmt_num(m.tolerance)), status_badge(m));
  return s + "</section>";
}

// ---- Mixed precision (MP-1, MP-3) ----------------------------------------------------------

// The first measurement of `id` whose details hold `key`.
const Measurement* measurement_with(const Results& r, const std::string& id, const char* key) {
  for (const auto& m : r.measurements)
    if (m.id == id && m.details.is_object() && m.details.contains(key) && !m.negative_control) return &m;
  return nullptr;
}

// MP-1's exponent histogram of the fp32 gradients, unscaled and shifted by the loss
// scale, with fp16's smallest subnormal (2^-24) and smallest normal (2^-14).
std::string mp_histogram_chart(const Measurement& m) {
  const json& h = m.details["exponent_histogram"];
  if (!h.is_object() || h.empty()) return not_measured("an empty MP-1 exponent histogram");
  const double scale = num_of(m.details, {"loss_scale"}).value_or(1.0);
  const int shift = scale > 0 ? static_cast<int>(std::lround(std::log2(scale))) : 0;
  Series plain{"fp32 gradients (count per exponent)", {}, palette()[0], false};
  Series scaled{fmt::format("scaled by 2^{}", shift), {}, palette()[1], true};
  double top = 0;
  std::map<int, double> bins;
  for (auto it = h.begin(); it != h.end(); ++it) {
    try {
      bins[std::stoi(it.key())] = json_to_double(*it);
    } catch (...) {
    }
  }
  for (const auto& [e, n] : bins) {
    plain.points.emplace_back(e, n);
    scaled.points.emplace_back(e + shift, n);
    top = std::max(top, n);
  }
  Series sub{"2^-24: fp16's smallest subnormal (under 2^-25 flushes)", {{-24, 0}, {-24, top}}, "#dc2626", true};
  Series nrm{"2^-14: fp16's smallest normal", {{-14, 0}, {-14, top}}, "#6b7280", true};
  ChartOptions o;
  o.title = "Exponents of the fp32 weight gradients (MP-1)";
  o.x_label = "binary exponent e (|g| in [2^e, 2^(e+1)))";
  o.y_label = "values";
  o.width = 760;
  return line_chart({plain, scaled, sub, nrm}, o);
}

// MP-3's scale trajectory: the scale each step ran at, GradScaler's rule beside it,
// and the skipped steps.
std::string mp_trajectory_chart(const Measurement& m) {
  const json& t = m.details["trajectory"];
  if (!t.is_object() || !t.contains("scale") || !t["scale"].is_array()) return not_measured("no MP-3 trajectory");
  Series got{"loss scale (measured)", {}, palette()[0], false};
  Series want{"GradScaler's rule", {}, palette()[2], true};
  std::vector<std::string> skipped;
  for (size_t i = 0; i < t["scale"].size(); ++i) {
    try {
      got.points.emplace_back(static_cast<double>(i), json_to_double(t["scale"][i]));
      if (t.contains("expected_scale") && i < t["expected_scale"].size())
        want.points.emplace_back(static_cast<double>(i), json_to_double(t["expected_scale"][i]));
      if (t.contains("skipped") && i < t["skipped"].size() && t["skipped"][i].is_boolean() &&
          t["skipped"][i].get<bool>())
        skipped.push_back(std::to_string(i));
    } catch (...) {
    }
  }
  ChartOptions o;
  o.title = fmt::format("Loss scale per step (growth interval {})",
                        esc(fmt_num(num_of(t, {"growth_interval"}).value_or(NAN))));
  o.x_label = "step";
  o.y_label = "loss scale";
  o.log_y = true;
  std::string out = line_chart({got, want}, o);
  std::string list;
  for (const auto& k : skipped) list += (list.empty() ? "" : ", ") + k;
  out += fmt::format("<p>Skipped steps (an overflowing micro-batch): {}.</p>", esc(list.empty() ? "none" : list));
  return out;
}

std::string curve_mp(const Results& r) {
  std::string s = section_open(
      "curve-mp", "Mixed precision: fp16 underflow and the loss scale (MP-1, MP-3)",
      "Where the fp32 gradients' exponents lie against fp16's range, without and with the loss scale "
      "(Micikevicius et al. 2018: ~5% of weight gradients under 2^-24), and the dynamic scaler's trajectory: "
      "back off by 0.5 at an overflow, grow by 2 after the growth interval of clean steps.");
  const Measurement* h = measurement_with(r, "MP-1", "exponent_histogram");
  const Measurement* t = measurement_with(r, "MP-3", "trajectory");
  if (!h && !t) return s + not_measured("no MP-1 histogram or MP-3 trajectory") + "</section>";
  std::string charts;
  charts += h ? mp_histogram_chart(*h) : not_measured("no MP-1 exponent histogram");
  charts += t ? mp_trajectory_chart(*t) : not_measured("no MP-3 scale trajectory");
  s += R"(<div class="charts">)" + charts + "</div>";
  if (h) {
    const json& d = h->details;
    s += fmt::format(
        "<p>Of {} non-zero fp32 gradient values, {} lie under 2^-24 and {} flush to zero in fp16 unscaled; "
        "scaled by {} {} flush.</p>",
        esc(fmt_num(num_of(d, {"nonzero_values"}).value_or(NAN))),
        esc(fmt_num(100 * num_of(d, {"fraction_below_2^-24"}).value_or(NAN)) + "%"),
        esc(fmt_num(100 * num_of(d, {"flushed_fraction_unscaled"}).value_or(NAN)) + "%"),
        esc(fmt_num(num_of(d, {"loss_scale"}).value_or(NAN))),
        esc(fmt_num(100 * num_of(d, {"flushed_fraction_scaled"}).value_or(NAN)) + "%"));
  }
  return s + "</section>";
}

// ---- Trade table ---------------------------------------------------------------------------

// The BM-FIT point of a trade row (same config.key), if the run has one.
const SweepPoint* fit_point_for(const Results& r, const SweepPoint& trade) {
  const std::string key = str_of(trade.config, "key");
  if (key.empty()) return nullptr;
  for (const auto& p : r.sweep_points)
    if (p.sweep == "BM-FIT" && str_of(p.config, "key") == key) return &p;
  return nullptr;
}

// One row's bytes by consumer, e.g. "W 3.6M G 3.6M O 7.2M A 172M WS 30M".
std::string consumer_bytes_cell(const SweepPoint& p) {
  static const std::pair<const char*, Consumer> keys[] = {{"W", Consumer::weights},
                                                          {"G", Consumer::gradients},
                                                          {"O", Consumer::optimizer_state},
                                                          {"A", Consumer::activations},
                                                          {"WS", Consumer::workspace}};
  std::string out;
  for (const auto& [abbr, c] : keys) {
    if (!out.empty()) out += " ";
    out += fmt::format("{}&nbsp;{}", abbr, esc(fmt_bytes_short(static_cast<double>(p.memory.peak(c)))));
  }
  return out;
}

// The loss column: error / bound against the reference, and a mark when the row breaks training.
std::string trade_loss_cell(const SweepPoint& p) {
  const auto err = num_of(p.metrics, {"loss_error"});
  const auto bound = num_of(p.metrics, {"loss_bound"});
  if (!err || !bound) return "-";
  const std::string ref = str_of(p.metrics, "loss_reference");
  const bool within = *err <= *bound;
  const std::string badge = within ? R"(<span class="badge b-ok">trains</span>)"
                                   : R"(<span class="badge b-bad">breaks training</span>)";
  std::string cell = fmt::format("{} {} of bound", badge, esc(fmt_num(*err / (*bound > 0 ? *bound : 1))));
  if (!ref.empty() && ref != "baseline") cell += fmt::format(" <span class=\"muted\">(vs {})</span>", esc(ref));
  return cell;
}

std::string trade_fit_cell(const Results& r, const SweepPoint& p) {
  const SweepPoint* f = fit_point_for(r, p);
  std::optional<double> mb = f && is_ok(*f) ? num_of(f->metrics, {"fit_micro_batch"}) : num_of(p.metrics, {"fit_micro_batch"});
  if (!mb) return f && !is_ok(*f) ? esc(f->status) : "-";
  std::string cell = fmt_num(*mb);
  if (f && f->metrics.value("at_search_cap", false)) cell = "&ge; " + cell;
  if (f) {
    if (auto model = num_of(f->metrics, {"predicted_fit_micro_batch"}); model && *model != *mb)
      cell += fmt::format(" <span class=\"badge b-bad\">model {}</span>", esc(fmt_num(*model)));
  }
  return cell;
}

std::string trade_section(const Results& r) {
  std::string s = section_open("trade", "The trade: memory saved against time paid (TRADE, BM-FIT)",
                               "The field guide's order applied cumulatively to one configuration: mixed precision, "
                               "sequence length and padding, accumulation, checkpointing, 8-bit optimizer, LoRA. "
                               "Each row adds one technique to the rows above it; all measured on this device: peak "
                               "bytes by consumer, step time, useful (non-pad) tokens/s, the loss after a few steps "
                               "against the baseline's, and the largest micro-batch that fits the budget (BM-FIT).");
  std::vector<const SweepPoint*> pts;
  for (const auto& p : r.sweep_points)
    if (p.sweep == "TRADE") pts.push_back(&p);
  if (pts.empty()) return s + not_measured("no TRADE sweep points") + "</section>";
  const SweepPoint* first = nullptr;
  for (const auto* p : pts)
    if (is_ok(*p)) { first = p; break; }
  double max_peak = 0;
  for (const auto* p : pts) max_peak = std::max(max_peak, static_cast<double>(p->memory.total_peak_bytes));
  auto rest_of = [](const SweepPoint& p) {
    json rest = p.config;
    if (rest.is_object()) rest.erase("technique"), rest.erase("step"), rest.erase("key");
    return rest;
  };
  bool any_config = false;
  for (const auto* p : pts) any_config = any_config || !config_label(rest_of(*p)).empty();
  const std::string cfg_th = any_config ? "<th>Config</th>" : "";
  s += R"(<table><thead><tr><th>#</th><th>Step</th>)" + cfg_th + R"(<th class="num">Peak bytes</th><th></th>)"
       R"(<th>By consumer</th><th class="num">Saved vs previous</th><th class="num">Saved vs start</th>)"
       R"(<th class="num">Step time</th><th class="num">Time vs start</th><th class="num">Throughput</th>)"
       R"(<th class="num">Useful tok/s</th><th>Loss vs baseline</th><th class="num">Fits micro-batch</th><th>Status</th></tr></thead><tbody>)";
  const SweepPoint* prev = nullptr;
  int n = 0;
  for (const auto* p : pts) {
    ++n;
    std::string label = str_of(p->config, "technique");
    if (label.empty()) label = str_of(p->config, "step");
    const json rest = rest_of(*p);
    if (!is_ok(*p)) {
      s += fmt::format(R"(<tr><td>{}</td><td><b>{}</b></td>{}<td colspan="11"></td><td><span class="badge b-warn">{}</span> {}</td></tr>)",
                       n, esc(label), any_config ? "<td class=\"mono\">" + esc(config_label(rest)) + "</td>" : "",
                       esc(p->status), esc(p->reason));
      continue;
    }
    const double peak = static_cast<double>(p->memory.total_peak_bytes);
    auto saved = [&](const SweepPoint* ref) -> std::string {
      if (!ref || ref == p || ref->memory.total_peak_bytes == 0) return "-";
      return fmt_pct(1.0 - peak / static_cast<double>(ref->memory.total_peak_bytes)).substr(0);
    };
    std::string tvs = "-";
    if (first && first != p && first->time && p->time && first->time->median_s > 0)
      tvs = fmt_pct(p->time->median_s / first->time->median_s - 1.0);
    std::string thr = "-";
    if (auto t = num_of(p->metrics, {"tokens_per_s"})) thr = fmt_si(*t) + " tok/s";
    else if (auto t2 = num_of(p->metrics, {"samples_per_s"})) thr = fmt_si(*t2) + " samples/s";
    std::string useful = "-";
    if (auto u = num_of(p->metrics, {"useful_tokens_per_s"})) useful = fmt_si(*u) + " tok/s";
    const double w = max_peak > 0 ? 120.0 * peak / max_peak : 0;
    s += fmt::format(
        R"(<tr><td>{}</td><td><b>{}</b></td>{}<td class="num">{}</td><td><span class="bar" style="width:{:.0f}px"></span></td>)"
        R"(<td class="mono">{}</td><td class="num">{}</td><td class="num">{}</td><td class="num">{}</td><td class="num">{}</td>)"
        R"(<td class="num">{}</td><td class="num">{}</td><td>{}</td><td class="num">{}</td><td><span class="badge b-ok">ok</span></td></tr>)",
        n, esc(label), any_config ? "<td class=\"mono\">" + esc(config_label(rest)) + "</td>" : "",
        esc(fmt_bytes_short(peak)), w, consumer_bytes_cell(*p), esc(saved(prev)), esc(saved(first)),
        esc(p->time ? fmt_seconds(p->time->median_s) : "-"), esc(tvs), esc(thr), esc(useful), trade_loss_cell(*p),
        trade_fit_cell(r, *p));
    prev = p;
  }
  s += "</tbody></table><p class=\"lead\" style=\"margin-top:8px\">Saved: positive = less memory. Time: positive = "
       "slower. The first two steps of the guide should save memory and time; the next three trade time for memory. "
       "Loss: the difference of the loss after the steps from the reference's, over the reference's progress, as a "
       "fraction of TRADE's bound; a row over it is marked as breaking training. By consumer: W weights, G gradients, "
       "O optimizer state, A activations, WS workspace (the batch included).</p>";
  // BM-FIT: how the budget was set and what the search did.
  std::vector<const SweepPoint*> fits;
  for (const auto& p : r.sweep_points)
    if (p.sweep == "BM-FIT") fits.push_back(&p);
  if (!fits.empty()) {
    s += R"(<h3>Largest micro-batch that fits (BM-FIT)</h3><table><thead><tr><th>Step</th><th class="num">Budget</th>)"
         R"(<th class="num">Found</th><th class="num">Memory model</th><th class="num">Probes</th>)"
         R"(<th class="num">Peak at fit</th><th class="num">Safety margin</th></tr></thead><tbody>)";
    for (const auto* f : fits) {
      const json& b = f->config.contains("budget_bytes") ? f->config["budget_bytes"] : json();
      const std::string budget = b.is_number() ? fmt_bytes_short(b.get<double>()) : (b.is_string() ? b.get<std::string>() : "-");
      auto num = [&](const char* k) { auto v = num_of(f->metrics, {k}); return v ? fmt_num(*v) : std::string("-"); };
      auto bytes = [&](const char* k) { auto v = num_of(f->metrics, {k}); return v ? fmt_bytes_short(*v) : std::string("-"); };
      std::string margin = bytes("safety_margin_bytes");
      if (auto fr = num_of(f->metrics, {"safety_margin_fraction"})) margin += " (" + fmt_pct(*fr) + ")";
      if (!is_ok(*f)) {
        s += fmt::format(R"(<tr><td>{}</td><td class="num">{}</td><td colspan="5"><span class="badge b-warn">{}</span> {}</td></tr>)",
                         esc(str_of(f->config, "technique")), esc(budget), esc(f->status), esc(f->reason));
        continue;
      }
      s += fmt::format(R"(<tr><td>{}</td><td class="num">{}</td><td class="num">{}</td><td class="num">{}</td>)"
                       R"(<td class="num">{}</td><td class="num">{}</td><td class="num">{}</td></tr>)",
                       esc(str_of(f->config, "technique")), esc(budget), esc(num("fit_micro_batch")),
                       esc(num("predicted_fit_micro_batch")), esc(num("probes")), esc(bytes("peak_bytes_at_fit")),
                       esc(margin));
    }
    s += "</tbody></table><p class=\"lead\" style=\"margin-top:8px\">Found: galloping then bisection over real steps "
         "(an out-of-memory, from the tracker's budget on the CPU or the device on a GPU, is &quot;does not fit&quot;). "
         "Memory model: MEM-1's prediction of the same answer. Safety margin: what the found micro-batch leaves of "
         "the budget.</p>";
  }
  return s + "</section>";
}

// ---- Data parallel (DP-MEM, DP-COMM, BM-DP) -------------------------------------------------

std::string dp_int(const json& j, const char* key) {
  const auto v = num_of(j, {key});
  return v ? fmt::format("{:.0f}", *v) : "-";
}

std::string dp_section(const Results& r) {
  std::string s = section_open("dp", "Data parallel across processes (DP, BM-DP)",
                               "N ranks under mpirun (MPI on CPU ranks, NCCL on GPU ranks): what each rank holds per "
                               "consumer, with AdamW's state unsharded and sharded (ZeRO-1); the bytes each step "
                               "communicates; all-reduce bandwidth (nccl-tests' algbw and busbw) and step time "
                               "against N.");
  std::vector<const SweepPoint*> mem, comm, bm;
  std::string skipped;
  for (const auto& p : r.sweep_points) {
    if (p.sweep != "DP-MEM" && p.sweep != "DP-COMM" && p.sweep != "BM-DP") continue;
    if (!is_ok(p)) {
      if (skipped.empty()) skipped = p.sweep + " " + p.status + ": " + p.reason;
      continue;
    }
    (p.sweep == "DP-MEM" ? mem : p.sweep == "DP-COMM" ? comm : bm).push_back(&p);
  }
  if (mem.empty() && comm.empty() && bm.empty())
    return s + not_measured(skipped.empty() ? "no DP-MEM, DP-COMM or BM-DP sweep points" : skipped) + "</section>";
  if (!skipped.empty()) s += fmt::format(R"(<p class="warn">{}</p>)", esc(skipped));

  s += "<h3>Bytes per consumer per rank</h3>";
  if (mem.empty()) {
    s += not_measured("no DP-MEM sweep points");
  } else {
    s += R"(<table><thead><tr><th>Ranks</th><th>Rank</th><th>Optimizer</th><th>Model</th>)";
    for (Consumer c : kAllConsumers) s += fmt::format(R"(<th class="num">{}</th>)", esc(consumer_name(c)));
    s += R"(<th class="num">Peak total</th></tr></thead><tbody>)";
    for (const auto* p : mem) {
      s += fmt::format("<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td>", esc(dp_int(p->config, "ranks")),
                       esc(dp_int(p->config, "rank")), esc(str_of(p->config, "optimizer")), esc(p->model));
      for (Consumer c : kAllConsumers)
        s += fmt::format(R"(<td class="num">{}</td>)", esc(fmt_bytes_short(static_cast<double>(p->memory.current(c)))));
      s += fmt::format(R"(<td class="num">{}</td></tr>)",
                       esc(fmt_bytes_short(static_cast<double>(p->memory.total_peak_bytes))));
    }
    s += "</tbody></table><p class=\"lead\" style=\"margin-top:8px\">Held after two steps (weights, gradients, "
         "optimizer state); peak total includes the step's activations and workspace.</p>";
  }

  s += "<h3>Communication per step</h3>";
  if (comm.empty()) {
    s += not_measured("no DP-COMM sweep points");
  } else {
    s += R"(<table><thead><tr><th>Ranks</th><th>Engine</th><th>Synchronisation</th><th>Model</th>)"
         R"(<th class="num">Micro-batches per rank</th><th class="num">Collectives</th>)"
         R"(<th class="num">Gradient bytes</th><th class="num">All bytes</th><th class="num">Bus bytes</th></tr></thead><tbody>)";
    for (const auto* p : comm)
      s += fmt::format(
          R"(<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td class="num">{}</td><td class="num">{}</td>)"
          R"(<td class="num">{}</td><td class="num">{}</td><td class="num">{}</td></tr>)",
          esc(dp_int(p->config, "ranks")), esc(str_of(p->config, "engine")), esc(str_of(p->config, "sync")),
          esc(p->model), esc(dp_int(p->config, "micro_batches_per_rank")), esc(dp_int(p->metrics, "collectives_per_step")),
          esc(fmt_bytes_short(num_of(p->metrics, {"gradient_payload_bytes_per_step"}).value_or(NAN))),
          esc(fmt_bytes_short(num_of(p->metrics, {"payload_bytes_per_step"}).value_or(NAN))),
          esc(fmt_bytes_short(num_of(p->metrics, {"bus_bytes_per_step"}).value_or(NAN))));
    s += "</tbody></table><p class=\"lead\" style=\"margin-top:8px\">Bytes by nccl-tests' definitions: the message "
         "size of each collective (all-gather: its output), and what crosses the busiest link of a ring "
         "(all-reduce 2 (N-1)/N of it, all-gather (N-1)/N).</p>";
  }

  s += "<h3>BM-DP</h3>";
  if (bm.empty()) {
    s += not_measured("no BM-DP sweep points");
  } else {
    s += R"(<table><thead><tr><th>Engine</th><th>Ranks</th><th>What</th><th class="num">Median time</th>)"
         R"(<th class="num">algbw</th><th class="num">busbw</th><th class="num">Throughput</th></tr></thead><tbody>)";
    for (const auto* p : bm) {
      const auto bytes = num_of(p->config, {"bytes"});
      const std::string what = bytes ? "all-reduce " + fmt_bytes_short(*bytes) : str_of(p->config, "what");
      const auto alg = num_of(p->metrics, {"algbw_GBps"}), bus = num_of(p->metrics, {"busbw_GBps"});
      const auto tok = num_of(p->metrics, {"tokens_per_s"});
      s += fmt::format(
          R"(<tr><td>{}</td><td>{}</td><td>{}</td><td class="num">{}</td><td class="num">{}</td><td class="num">{}</td><td class="num">{}</td></tr>)",
          esc(str_of(p->config, "engine")), esc(dp_int(p->config, "ranks")), esc(what),
          esc(p->time ? fmt_seconds(p->time->median_s) : "-"), esc(alg ? fmt::format("{:.3g} GB/s", *alg) : "-"),
          esc(bus ? fmt::format("{:.3g} GB/s", *bus) : "-"), esc(tok ? fmt_si(*tok) + " tok/s" : "-"));
    }
    s += "</tbody></table>";
  }
  return s + "</section>";
}

// ---- Baseline --------------------------------------------------------------------------------

std::string baseline_section(const Results& r, const ReportOptions& opt) {
  std::string s = section_open("baseline", "Baseline comparison", "");
  if (!opt.comparison || !opt.baseline) {
    s += R"(<div class="empty">No baseline was given. To judge this device against one already trusted: )"
         R"(<code>headroom validate --baseline trusted/results.json</code>.</div>)";
    return s + "</section>";
  }
  const Comparison& c = *opt.comparison;
  const Results& b = *opt.baseline;
  s += fmt::format(R"(<div class="verdict {}"><strong>{}</strong>{}</div>)", c.fit() ? "fit" : "notfit",
                   c.fit() ? "FIT" : (c.partial ? "PARTIAL" : "NOT FIT"),
                   c.fit() ? "Every check and sweep point of the baseline ran and held under the baseline's bound, and "
                             "nothing regressed beyond the noise of both runs."
                           : esc(fmt::format("{} reason{} below.", c.failures.size(), c.failures.size() == 1 ? "" : "s")));
  if (!c.failures.empty()) {
    s += R"(<h3>Why not fit</h3><ul class="reasons">)";
    for (const auto& f : c.failures) s += "<li>" + esc(f) + "</li>";
    s += "</ul>";
  }
  {
    // Every check of the baseline that did not pass here, with why.
    std::string rows;
    int n = 0;
    for (const CheckRow& k : c.checks) {
      if (k.verdict != "fail" && k.verdict != "missing") continue;
      ++n;
      rows += fmt::format(R"(<tr><td class="mono">{}</td><td><span class="badge {}">{}</span></td><td class="num">{}</td><td class="num">{}</td><td>{}</td></tr>)",
                          esc(k.check), k.verdict == "fail" ? "b-bad" : "b-warn", esc(k.verdict),
                          esc(fmt_num(k.error)), esc(fmt_num(k.bound)), esc(k.message));
    }
    s += fmt::format(R"(<h3>Checks of the baseline: {} matched, {} missing, {} failed; {} new in this run</h3>)",
                     c.checks_matched, c.checks_missing, c.conformance_failed, c.checks_new);
    if (n > 0)
      s += R"(<table><thead><tr><th>Check</th><th>Verdict</th><th class="num">Error</th><th class="num">Bound</th>)"
           R"(<th>Why</th></tr></thead><tbody>)" + rows + "</tbody></table>";
  }
  if (!c.warnings.empty()) {
    s += R"(<h3>Flags</h3><ul class="reasons warn">)";
    for (const auto& w : c.warnings) s += "<li>" + esc(w) + "</li>";
    s += "</ul>";
  }
  s += fmt::format(R"(<p class="lead" style="margin-top:12px">Thresholds: a step time differs when its median moved )"
                   R"(by more than {:.0f}% ({:.0f}% for CPU time) and a rank test over both runs' samples gives p &lt; {:g}; a larger change )"
                   R"(the test cannot confirm is noisy, and a slower one is re-measured before validate calls it a )"
                   R"(regression. Memory peaks agree within {:.0f}%; check power may grow up to {:g}x. {} points )"
                   R"(matched: {} regressions, {} improvements, {} noisy, {} missing, {} new.</p>)",
                   c.options.time_floor * 100, c.options.cpu_time_floor * 100, c.options.time_alpha,
                   c.options.memory_tolerance * 100,
                   c.options.power_growth, c.matched_points, c.regressions, c.improvements, c.noisy, c.missing,
                   c.added);
  s += R"(<table class="kv"><thead><tr><th></th><th>Baseline</th><th>This run</th></tr></thead><tbody>)";
  auto row = [&](const char* k, const std::string& a, const std::string& bb) {
    s += fmt::format("<tr><td>{}</td><td>{}</td><td>{}</td></tr>", esc(k), esc(a), esc(bb));
  };
  if (!opt.baseline_source.empty()) row("file", opt.baseline_source, "");
  row("device", str_of(b.device, "name"), str_of(r.device, "name"));
  row("backend", b.backend, r.backend);
  row("driver", str_of(b.device, "driver_version"), str_of(r.device, "driver_version"));
  row("git SHA", str_of(b.build, "git_sha"), str_of(r.build, "git_sha"));
  row("run at (UTC)", b.run_time_utc, r.run_time_utc);
  row("preset", b.preset, r.preset);
  row("seed", std::to_string(b.seed), std::to_string(r.seed));
  row("run", run_kind(b), run_kind(r));
  auto host = [](const Results& x) {
    return x.host ? fmt::format("{} CPUs, {:.2g} busy with other work{}", x.host->cpus, x.host->other_busy_cpus,
                                x.host->busy() ? " (busy)" : "")
                  : std::string("not recorded");
  };
  row("host", host(b), host(r));
  s += "</tbody></table>";

  auto table = [&](bool interesting) {
    std::string t = R"(<table><thead><tr><th>Point</th><th>Quantity</th><th class="num">Baseline</th><th class="num">This run</th>)"
                    R"(<th class="num">Change</th><th class="num">Threshold</th><th>Verdict</th><th>Note</th></tr></thead><tbody>)";
    int rows = 0;
    for (const auto& row : c.rows) {
      const bool same = row.verdict == "same";
      if (interesting == same) continue;
      ++rows;
      std::string point = row.sweep;
      for (const auto* part : {&row.backend, &row.dtype, &row.model})
        if (!part->empty()) point += " " + *part;
      const bool time = row.quantity == "step time" || row.quantity == "step cpu time",
                 status = row.quantity == "status",
                 power = row.quantity == "power";
      auto val = [&](double v) {
        if (status || std::isnan(v)) return std::string("-");
        if (power) return fmt::format("{:.3g}x bound", v);
        return time ? fmt_seconds(v) : fmt_bytes_short(v);
      };
      const char* badge = row.verdict == "regression" ? "b-bad"
                          : row.verdict == "better"   ? "b-ok"
                          : row.verdict == "same"     ? "b-na"
                                                      : "b-warn";
      t += fmt::format(
          R"(<tr><td>{} <span class="mono">{}</span></td><td>{}</td><td class="num">{}</td><td class="num">{}</td><td class="num">{}</td><td class="num">{}</td><td><span class="badge {}">{}</span></td><td>{}</td></tr>)",
          esc(point), esc(config_label(row.config)), esc(row.quantity), esc(val(row.baseline)), esc(val(row.current)),
          esc(status ? "" : fmt_pct(row.change)), std::isfinite(row.threshold) ? fmt::format("&plusmn;{:.1f}%", row.threshold * 100) : std::string(),
          badge, esc(row.verdict), esc(row.note));
    }
    t += "</tbody></table>";
    return std::make_pair(t, rows);
  };
  auto [changed, n_changed] = table(true);
  auto [same, n_same] = table(false);
  s += fmt::format("<h3>Changes ({})</h3>", n_changed);
  s += n_changed ? changed : R"(<div class="empty">No point changed beyond its threshold.</div>)";
  if (n_same) s += fmt::format(R"(<details><summary>{} unchanged quantities</summary>{}</details>)", n_same, same);
  return s + "</section>";
}

// ---- Run record ---------------------------------------------------------------------------------

std::string run_section(const Results& r) {
  std::string s = section_open("run", "Run record",
                               "What ran, how long it took against its quick-preset estimate, and every sweep point "
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
    s += R"(<table><thead><tr><th>Kind</th><th>ID</th><th>Title</th><th class="num">Seconds</th><th class="num">Expected (quick)</th><th class="num">Items</th><th>Error</th></tr></thead><tbody>)";
    for (const auto& t : r.timings)
      s += fmt::format(R"(<tr><td>{}</td><td><b>{}</b></td><td>{}</td><td class="num">{:.2f}</td><td class="num">{:.1f}</td><td class="num">{}</td><td>{}</td></tr>)",
                       esc(t.kind), esc(t.id), esc(t.title), t.seconds, t.expected_seconds_quick, t.items, esc(t.error));
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

}  // namespace

std::string render_report(const Results& r, const ReportOptions& opt) {
  std::string h;
  h.reserve(1 << 16);
  const std::string dev_name = str_of(r.device, "name");
  h += "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
       "<meta name=\"viewport\" content=\"width=device-width,initial-scale=1\">";
  h += fmt::format("<title>headroom report: {}</title>", esc(dev_name));
  h += "<style>";
  h += kCss;
  h += "</style></head><body>";
  h += fmt::format(R"(<header class="top"><div class="wrap"><div><h1>headroom<small>memory-saving training techniques: conformance and cost</small></h1>)"
                   R"(<div class="sub">{} &middot; {} &middot; {} preset &middot; {}</div></div>)"
                   R"(<div class="sub">headroom {} &middot; {}</div></div></header>)",
                   esc(dev_name), esc(r.backend), esc(r.preset), esc(r.run_time_utc), esc(str_of(r.build, "version")),
                   esc(str_of(r.build, "git_sha")));
  h += R"(<nav class="toc"><div class="wrap">)";
  for (const auto& [id, name] : std::initializer_list<std::pair<const char*, const char*>>{
           {"summary", "Summary"}, {"device", "Device"}, {"conformance", "Conformance"}, {"memory", "Memory"},
           {"curve-bm-mb", "Micro-batch"}, {"curve-ck-3", "Depth"}, {"curve-seq", "Sequence"},
           {"curve-q8-3", "8-bit state"}, {"curve-mp", "Mixed precision"}, {"trade", "Trade"}, {"dp", "Data parallel"}, {"baseline", "Baseline"}, {"run", "Run"}})
    h += fmt::format(R"(<a href="#{}">{}</a>)", id, name);
  h += R"(</div></nav><main class="wrap">)";
  h += summary(r, opt);
  h += device_section(r);
  h += conformance_section(r);
  h += memory_section(r);
  h += curve_bm_mb(r);
  h += curve_ck3(r);
  h += curve_seq(r);
  h += curve_q83(r);
  h += curve_mp(r);
  h += trade_section(r);
  h += dp_section(r);
  h += baseline_section(r, opt);
  h += run_section(r);
  h += fmt::format(R"(</main><footer>headroom.results/1 &middot; generated from results.json &middot; this page needs )"
                   R"(no network and no scripts</footer></body></html>)");
  h += "\n";
  return h;
}

}  // namespace hr::report
