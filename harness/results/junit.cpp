// JUnit XML: test cases per check and per sweep point (see junit.hpp).
#include "harness/results/junit.hpp"

#include <fmt/format.h>

#include <map>
#include <sstream>
#include <vector>

#include "harness/output.hpp"
#include "reports/html.hpp"

namespace hr {

namespace {

// Text for XML attributes: the report's escaping (& < > " '), after the control
// characters that XML 1.0 cannot hold (all but tab, newline, carriage return) are
// replaced by '?'.
std::string xml(std::string s) {
  for (char& ch : s)
    if (static_cast<unsigned char>(ch) < 0x20 && ch != '\t' && ch != '\n' && ch != '\r') ch = '?';
  return report::esc(s);
}

struct Case {
  std::string classname, name, failure, skipped;
};

std::string point_name(const SweepPoint& p) {
  std::string s;
  for (const std::string* part : {&p.backend, &p.dtype, &p.model})
    if (!part->empty()) s += (s.empty() ? "" : " ") + *part;
  const std::string cfg = config_label(p.config);
  if (!cfg.empty()) s += " " + cfg;
  return s.empty() ? p.sweep : s;
}

std::string id_of(const std::string& check) { return check.substr(0, check.find(" | ")); }

}  // namespace

std::string junit_xml(const Results& run, const Comparison* cmp) {
  std::vector<Case> cases;
  if (cmp != nullptr) {
    for (const CheckRow& c : cmp->checks) {
      Case k{id_of(c.check), c.check, "", ""};
      if (c.verdict == "fail") k.failure = c.message;
      if (c.verdict == "missing") k.failure = "missing from this run: " + c.message;
      cases.push_back(std::move(k));
    }
    // One case per sweep point of the comparison, failing with every reason its rows give.
    std::map<std::string, size_t> index;
    for (const CompareRow& r : cmp->rows) {
      if (r.quantity == "power") {
        Case k{r.sweep, "check power " + r.backend + " " + r.dtype + " " + r.model, "", ""};
        if (r.verdict == "regression") k.failure = r.note;
        cases.push_back(std::move(k));
        continue;
      }
      SweepPoint p;
      p.sweep = r.sweep, p.backend = r.backend, p.dtype = r.dtype, p.model = r.model, p.config = r.config;
      const std::string key = r.sweep + "\x1f" + point_name(p);
      auto [it, fresh] = index.emplace(key, cases.size());
      if (fresh) cases.push_back(Case{r.sweep, point_name(p), "", ""});
      Case& k = cases[it->second];
      if (r.verdict == "regression" || r.verdict == "missing")
        k.failure += (k.failure.empty() ? "" : "; ") + fmt::format("{}: {}", r.quantity, r.note);
    }
    for (const auto& p : run.sweep_points) {
      if (p.status != "error") continue;
      const std::string key = p.sweep + "\x1f" + point_name(p);
      auto [it, fresh] = index.emplace(key, cases.size());
      if (fresh) cases.push_back(Case{p.sweep, point_name(p), "", ""});
      cases[it->second].failure += (cases[it->second].failure.empty() ? "" : "; ") + ("ended in error: " + p.reason);
    }
  } else {
    for (const auto& m : run.measurements) {
      Case k{m.id, m.check.empty() ? default_check_key(m) : m.check, "", ""};
      if (!m.passed) {
        k.failure = is_error_measurement(m) ? fmt::format("threw: {}", m.details.value("error", ""))
                    : m.negative_control
                        ? fmt::format("negative control not caught: {} {} against the bound {}", m.metric,
                                      json_number(m.error).dump(), json_number(m.tolerance).dump())
                        : fmt::format("{} {} exceeds the bound {}", m.metric, json_number(m.error).dump(),
                                      json_number(m.tolerance).dump());
      }
      cases.push_back(std::move(k));
    }
    for (const auto& p : run.sweep_points) {
      Case k{p.sweep, point_name(p), "", ""};
      if (p.status == "error") k.failure = "ended in error: " + p.reason;
      if (p.status == "skipped") k.skipped = p.reason;
      cases.push_back(std::move(k));
    }
  }
  for (const auto& t : run.timings)
    if (!t.skipped.empty()) cases.push_back(Case{t.id, t.id + " (" + t.kind + ")", "", t.skipped});
  for (const auto& id : run.not_run) cases.push_back(Case{id, id, "not run: the run was interrupted", ""});
  if (cmp == nullptr && run_kind(run) == "empty")
    cases.push_back(Case{"headroom", "the run measured something", "nothing was measured", ""});

  int failures = 0, skipped = 0;
  for (const auto& k : cases) {
    failures += k.failure.empty() ? 0 : 1;
    skipped += k.skipped.empty() ? 0 : 1;
  }
  std::ostringstream o;
  o << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  const std::string suite = cmp != nullptr ? "headroom validate" : "headroom run";
  o << fmt::format("<testsuites name=\"{}\" tests=\"{}\" failures=\"{}\" errors=\"0\" skipped=\"{}\" time=\"{:.3f}\">\n",
                   xml(suite), cases.size(), failures, skipped, run.duration_s);
  o << fmt::format("  <testsuite name=\"{} {} {} seed {}\" tests=\"{}\" failures=\"{}\" errors=\"0\" skipped=\"{}\" "
                   "timestamp=\"{}\">\n",
                   xml(suite), xml(run.preset), xml(run.backend), run.seed, cases.size(), failures, skipped,
                   xml(run.run_time_utc));
  for (const auto& k : cases) {
    o << fmt::format("    <testcase classname=\"{}\" name=\"{}\"", xml(k.classname), xml(k.name));
    if (k.failure.empty() && k.skipped.empty()) {
      o << "/>\n";
      continue;
    }
    o << ">\n";
    if (!k.failure.empty()) o << fmt::format("      <failure message=\"{}\"/>\n", xml(k.failure));
    if (!k.skipped.empty()) o << fmt::format("      <skipped message=\"{}\"/>\n", xml(k.skipped));
    o << "    </testcase>\n";
  }
  o << "  </testsuite>\n</testsuites>\n";
  return o.str();
}

void write_junit(const std::string& path, const Results& run, const Comparison* comparison) {
  write_output(path, junit_xml(run, comparison));
}

}  // namespace hr
