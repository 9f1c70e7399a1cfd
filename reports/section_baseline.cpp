// The baseline section: the verdict against a trusted run and what it rests on.
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
  if (!b.attention_kernel.empty() || !r.attention_kernel.empty())
    row("attention kernels", b.attention_kernel.empty() ? "-" : b.attention_kernel,
        r.attention_kernel.empty() ? "-" : r.attention_kernel);
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

}  // namespace hr::report::detail
