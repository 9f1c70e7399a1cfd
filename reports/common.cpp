// The report's shared toolkit (reports/parts.hpp): readers of results fields, the
// page frame and its CSS, section openers, and series made from sweep points.
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
#include "reports/html.hpp"
#include "reports/svg.hpp"

namespace hr::report::detail {

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

// Catalogue order of the field guide (docs/catalogue.md), then the number.
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
table.matrix td.cell small{white-space:normal}
table.matrix td.prop{min-width:220px}
table.matrix td.prop small{display:block;color:var(--muted);font-size:11px}
.scroll{overflow-x:auto;max-width:100%}
.scroll th{position:static}
ul.glance{margin:14px 0 0;padding-left:20px}ul.glance li{margin:2px 0}ul.glance li.bad{color:var(--bad)}
th small,table.trade td small{font-weight:400;color:var(--muted);font-size:11px}
td.mono,td .mono{overflow-wrap:anywhere}
td.cfg{min-width:160px}
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

std::string short_config_label(const json& config, const std::set<std::string>& varying, bool with_keys) {
  std::string s;
  if (!config.is_object()) return config.is_null() ? "" : config.dump();
  for (auto it = config.begin(); it != config.end(); ++it) {
    if (!varying.count(it.key()) || it->is_null()) continue;
    const std::string v = it->is_string() ? it->get<std::string>() : it->dump();
    s += (s.empty() ? "" : " ") + (with_keys ? it.key() + "=" + v : v);
  }
  return s;
}

std::string short_title(const std::string& title, size_t max_chars) {
  if (title.size() <= max_chars) return title;
  size_t cut = title.rfind(' ', max_chars - 1);
  if (cut == std::string::npos || cut < max_chars / 2) cut = max_chars - 1;
  std::string s = title.substr(0, cut);
  while (!s.empty() && (s.back() == ',' || s.back() == ':' || s.back() == ';')) s.pop_back();
  return s + "\u2026";
}

std::string not_measured(const std::string& what) {
  return fmt::format(R"(<div class="empty">Not measured in this run: {}.</div>)", esc(what));
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

const std::vector<std::string>& consumer_colors() {
  static const std::vector<std::string> c = {"#4E79A7", "#F28E2B", "#E15759", "#59A14F", "#B0A9A3"};
  return c;
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

}  // namespace hr::report::detail
