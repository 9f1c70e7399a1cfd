// The conformance section: failures first, the matrix of properties by backend
// and dtype with each check's power, and every measurement.
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
      "Each property (docs/catalogue.md) by backend and dtype. A cell shows the worst case over its configurations: "
      "<b>headroom</b> is tolerance / error for a check (how far inside its bound it stayed; <i>exact</i> = zero "
      "error) and error / tolerance for a negative control (the broken variant, which must be caught). "
      "<b>Power</b> is the smallest injected error the property's checks caught, relative to their bound: "
      "a power of 20x means a fault 20 times the bound was seen. Every check carries a <i>subtle</i> "
      "control (within 100x of its bound) beside the gross failure mode; PK-2's controls are gross failures of "
      "PK-1's check, which has its subtle one, so PK-2's row shows none.");
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

  s += R"(<h3>Matrix</h3><div class="scroll"><table class="matrix"><thead><tr><th>Property</th>)";
  for (const auto& [b, d] : cols)
    s += fmt::format(R"(<th class="mid">{}<br><span class="mono">{}</span></th>)", esc(b), esc(d.empty() ? "-" : d));
  s += R"(<th class="mid">Power<br><span class="mono">smallest caught</span></th>)";
  s += "</tr></thead><tbody>";
  for (const auto& id : ids) {
    // A short title; the whole one on hover and in the measurement list below.
    s += fmt::format(R"(<tr><td class="prop" title="{}"><b>{}</b> {}</td>)", esc(titles[id]), esc(id),
                     esc(short_title(titles[id], 60)));
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
  s += "</tbody></table></div>";

  // Every measurement, in catalogue order.
  std::vector<const Measurement*> all;
  for (const auto& m : r.measurements) all.push_back(&m);
  std::stable_sort(all.begin(), all.end(), [](const Measurement* a, const Measurement* b) {
    return std::make_pair(id_order(a->id), a->id) < std::make_pair(id_order(b->id), b->id);
  });
  s += fmt::format(R"(<details{}><summary>All {} measurements: error against tolerance</summary>)",
                   all.size() <= 40 ? " open" : "", all.size());
  s += R"(<div class="scroll"><table><thead><tr><th>ID</th><th>Run on</th><th>Config</th><th>Metric</th>)"
       R"(<th class="num">Error</th><th class="num">Tolerance</th><th class="num">Headroom</th><th>Control</th><th>Result</th><th>Tolerance from</th></tr></thead><tbody>)";
  for (const auto* m : all) {
    s += fmt::format(
        R"(<tr><td class="nw"><b>{}</b></td><td class="nw">{} {}<br><small>{}</small></td><td class="mono cfg">{}</td><td>{}</td><td class="num">{}</td><td class="num nw">{}{}</td><td class="num">{}</td><td>{}</td><td>{}</td><td>{}</td></tr>)",
        esc(m->id), esc(m->backend), esc(m->dtype), esc(m->model), esc(config_label(m->config)),
        esc_breakable(m->metric),
        esc(fmt_num(m->error)), m->negative_control ? "&gt; " : "&le; ", esc(fmt_num(m->tolerance)),
        esc(ratio_text(headroom_ratio(*m))), esc(m->control.empty() ? "-" : m->control), status_badge(*m),
        esc(is_error_measurement(*m) ? m->details.value("error", std::string()) : m->tolerance_reason));
  }
  s += "</tbody></table></div></details></section>";
  return s;
}

}  // namespace hr::report::detail
