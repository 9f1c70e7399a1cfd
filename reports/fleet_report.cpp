// The fleet report (see fleet_report.hpp), from the run report's page frame and CSS.
#include "reports/fleet_report.hpp"

#include <fmt/format.h>

#include "harness/fleet/fleet.hpp"
#include "reports/html.hpp"
#include "reports/parts.hpp"

namespace hr::report {
namespace {

using nlohmann::json;
using detail::num_of;
using detail::str_of;

std::string badge(const std::string& verdict) {
  if (verdict == "ok" || verdict == "pass") return R"(<span class="badge b-ok">)" + esc(verdict) + "</span>";
  if (verdict == "slow") return R"(<span class="badge b-warn">slow</span>)";
  if (verdict == "alone") return R"(<span class="badge b-na">alone</span>)";
  if (verdict.empty()) return R"(<span class="badge b-na">-</span>)";
  return R"(<span class="badge b-bad">)" + esc(verdict) + "</span>";
}

// A check's cell: its verdict and the line that says why.
std::string check_cell(const json& d, const char* check) {
  if (str_of(d, "status") != "ok") return R"(<td class="cell na">&middot;</td>)";
  const json& c = d["checks"].value(check, json::object());
  const std::string v = str_of(c, "verdict");
  std::string note;
  if (std::string(check) == "digest") {
    if (c.contains("first_difference") && c["first_difference"].is_object()) {
      const json& f = c["first_difference"];
      note = fmt::format("first at {} step {}: {}", str_of(f, "config"), str_of(f, "step"), str_of(f, "tensor"));
    } else {
      note = str_of(c, "sha256").substr(0, 12);
    }
  } else if (std::string(check) == "self_repeat") {
    const json& f = c.value("first_difference", json());
    note = f.is_object() ? fmt::format("first at {} step {}: {}", str_of(f, "config"), str_of(f, "step"), str_of(f, "tensor"))
                         : "bit for bit";
  } else if (std::string(check) == "conformance") {
    note = fmt::format("{} of {} passed", str_of(c, "passed"), str_of(c, "measurements"));
  } else {
    for (const char* k : {"step", "gemm", "copy"}) {
      const json& m = c["metrics"].value(k, json::object());
      if (m.value("slow", false))
        note += fmt::format("{}{} {:.0f}% below the others", note.empty() ? "" : "; ", k, 100 * m.value("deficit", 0.0));
    }
    if (note.empty()) note = "within the floor";
  }
  const char* cls = v == "fail" ? "bad" : v == "pass" ? "ok" : "na";
  return fmt::format(R"(<td class="cell {}">{}<small>{}</small></td>)", cls, badge(v == "fail" ? "fail" : v),
                     esc_breakable(note));
}

std::string throughput_cell(const json& d, const char* key) {
  if (str_of(d, "status") != "ok") return R"(<td class="num">-</td>)";
  const json& m = d["checks"]["throughput"]["metrics"].value(key, json::object());
  const double v = m.value("value", 0.0), med = m.value("others_median", 0.0);
  std::string note = med > 0 ? esc(fmt_pct(v / med - 1.0)) + " vs the others" : std::string("-");
  if (!m.value("judged", true)) note += "; not judged";
  std::string s = fmt::format(R"(<td class="num{}">{}<small>{}</small></td>)", m.value("slow", false) ? " bad" : "",
                              esc(fmt_num(v)), note);
  return s;
}

}  // namespace

std::string render_fleet_report(const json& fleet) {
  const json& s = fleet.value("summary", json::object());
  const bool pass = str_of(fleet, "verdict") == "pass";
  std::string h;
  h += "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
       "<meta name=\"viewport\" content=\"width=device-width,initial-scale=1\">";
  h += fmt::format("<title>headroom fleet: {} devices, level {}</title><style>", str_of(s, "devices"), str_of(fleet, "level"));
  h += detail::kCss;
  h += "td.num small{display:block;color:var(--muted);font-size:11px}td.num.bad{color:var(--bad);font-weight:650}</style></head><body>";
  h += fmt::format(R"(<header class="top"><div class="wrap"><div><h1>headroom fleet<small>every device checked side by side</small></h1>)"
                   R"(<div class="sub">{} ranks &middot; {} &middot; level {}: {} &middot; {}</div></div>)"
                   R"(<div class="sub">headroom {} &middot; {}</div></div></header><main class="wrap">)",
                   esc(str_of(fleet, "ranks")), esc(str_of(fleet, "backend")), esc(str_of(fleet, "level")),
                   esc(str_of(fleet, "level_what")), esc(str_of(fleet, "run_time_utc")),
                   esc(str_of(fleet["build"], "version")), esc(str_of(fleet["build"], "git_sha")));

  h += detail::section_open("summary", "Verdict", "");
  h += fmt::format(R"(<div class="verdict {}"><strong>{}</strong>{} of {} devices ok: {} slow, {} wrong, {} failed.</div>)",
                   pass ? "fit" : "notfit", pass ? "PASS" : "FAIL", esc(str_of(s, "ok")), esc(str_of(s, "devices")),
                   esc(str_of(s, "slow")), esc(str_of(s, "wrong")), esc(str_of(s, "failed")));
  h += R"(<p class="lead"><b>wrong</b>: the step digest (SHA-256 of the loss, every gradient and every updated weight )"
       R"(after each of a few fixed-seed steps with accumulation, checkpointing with dropout and fp16 loss scaling) differs )"
       R"(from the majority of devices of the same kind, driver and build, or from the device's own second run, or a )"
       R"(conformance check failed. <b>slow</b>: a throughput (the median of the device's rounds, each its fastest )"
       R"(repetition) below the median of the other devices by more than the floor )"
       R"((GPU 5%, CPU stand-ins 15%) and by more than their own spread allows (3.5 deviations from their median absolute )"
       R"(deviation), or below the baseline's by more than the floor. <b>failed</b>: no complete record (crashed, hung )"
       R"(past the level's budget, no device).</p>)";
  if (fleet.contains("all_reduce")) {
    const json& a = fleet["all_reduce"];
    h += fmt::format(R"(<p>All-reduce across the fleet: {} {}</p>)", badge(str_of(a, "status") == "ok" ? "ok" : str_of(a, "status")),
                     esc(str_of(a, "reason")));
  }
  h += "</section>";

  h += detail::section_open("devices", "Devices", "Flagged devices first. A cell's small line says why.");
  h += R"(<div class="scroll"><table class="matrix"><thead><tr><th>Rank</th><th>Device</th><th>Verdict</th>)"
       R"(<th class="mid">Digest</th><th class="mid">Own repeat</th><th class="mid">Conformance</th>)"
       R"(<th class="mid">Throughput</th><th class="num">Step<br><small>tokens/s</small></th>)"
       R"(<th class="num">GEMM<br><small>TFLOP/s</small></th><th class="num">Copy<br><small>GB/s</small></th></tr></thead><tbody>)";
  for (const json& d : fleet.value("devices", json::array())) {
    std::string who = esc(str_of(d, "device_name"));
    if (!str_of(d, "host").empty()) who += "<br><small>" + esc(str_of(d, "host"));
    if (!str_of(d, "uuid").empty()) who += " &middot; " + esc(str_of(d, "uuid"));
    if (!str_of(d, "pci_bus_id").empty()) who += " &middot; bus " + esc(str_of(d, "pci_bus_id"));
    if (!str_of(d, "host").empty()) who += "</small>";
    std::string verdict = badge(str_of(d, "verdict"));
    if (str_of(d, "status") != "ok") {
      std::string why;
      for (const auto& r : d.value("reasons", json::array())) why += (why.empty() ? "" : "; ") + r.get<std::string>();
      verdict += "<br><small>" + esc(why) + "</small>";
    }
    h += fmt::format(R"(<tr><td class="nw"><b>{}</b></td><td>{}</td><td>{}</td>)", esc(str_of(d, "rank")), who, verdict);
    for (const char* c : {"digest", "self_repeat", "conformance", "throughput"}) h += check_cell(d, c);
    for (const char* k : {"step", "gemm", "copy"}) h += throughput_cell(d, k);
    h += "</tr>";
  }
  h += "</tbody></table></div></section>";

  h += detail::section_open("reasons", "Why each flagged device is flagged", "");
  bool any = false;
  for (const json& d : fleet.value("devices", json::array())) {
    const auto& reasons = d.value("reasons", json::array());
    if (reasons.empty()) continue;
    any = true;
    h += fmt::format(R"(<h3>Rank {} &middot; {}</h3><ul class="reasons">)", esc(str_of(d, "rank")), esc(str_of(d, "verdict")));
    for (const auto& r : reasons) h += "<li>" + esc_breakable(r.get<std::string>()) + "</li>";
    h += "</ul>";
  }
  if (!any) h += detail::not_measured("no device is flagged");
  h += "</section>";

  h += detail::section_open("run", "Run", "");
  h += R"(<table class="kv"><tbody>)";
  for (const auto& [k, label] : std::initializer_list<std::pair<const char*, const char*>>{
           {"seconds", "wall time (s)"}, {"budget_s_per_device", "budget per device (s)"}, {"seed", "seed"},
           {"baseline", "baseline"}}) {
    if (!fleet.contains(k)) continue;
    h += fmt::format("<tr><td>{}</td><td>{}</td></tr>", label, esc(str_of(fleet, k)));
  }
  h += fmt::format(R"(<tr><td>mpirun</td><td class="mono">{}</td></tr>)", esc(str_of(fleet["mpirun"], "command")));
  h += "</tbody></table></section>";
  h += fmt::format("</main><footer>{} &middot; generated", fleet::kFleetSchema);
  h += R"( from fleet.json &middot; this page needs no network and no scripts</footer></body></html>)";
  h += "\n";
  return h;
}

}  // namespace hr::report
