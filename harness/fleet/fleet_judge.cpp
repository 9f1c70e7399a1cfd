// The fleet's judgement of its rank records, and its JUnit form (see fleet.hpp).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "harness/fleet/digest.hpp"
#include "harness/fleet/fleet.hpp"
#include "harness/fleet/fleet_internal.hpp"
#include "harness/tolerances.hpp"
#include "reports/html.hpp"

namespace hr::fleet {

double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n == 0 ? NAN : n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double round_median(const nlohmann::json& round_values) {
  std::vector<double> v;
  for (const auto& x : round_values) v.push_back(x.get<double>());
  return median_of(std::move(v));
}

namespace {

// The median of a metric over a baseline fleet's ok devices of this device's name.
std::optional<double> baseline_median(const nlohmann::json& baseline, const std::string& device_name, const char* key) {
  if (!baseline.is_object()) return std::nullopt;
  std::vector<double> v;
  for (const auto& d : baseline.value("devices", nlohmann::json::array())) {
    if (d.value("device_name", "") != device_name || d.value("status", "") != "ok") continue;
    const auto& m = d["checks"]["throughput"]["metrics"];
    if (m.contains(key) && m[key].contains("value")) v.push_back(m[key]["value"].get<double>());
  }
  if (v.empty()) return std::nullopt;
  return median_of(v);
}

// What an ok record must hold to be judged; empty when it does, else what it lacks
// (a record from another version, cut short or edited by hand is a failed device,
// not a crash of the judgement).
std::string incomplete(const nlohmann::json& rec) {
  for (const char* k : {"digest", "throughput", "conformance", "device", "build"})
    if (!rec.contains(k) || !rec[k].is_object()) return fmt::format("its record has no '{}'", k);
  const nlohmann::json& d = rec["digest"];
  if (!d.contains("sha256") || !d["sha256"].is_string() || !d.contains("configs") || !d["configs"].is_array())
    return "its record's digest is not one";
  for (const Metric& m : kMetrics)
    if (!rec["throughput"].contains(m.key) || !rec["throughput"][m.key].is_object() ||
        !rec["throughput"][m.key].value("value", nlohmann::json()).is_number())
      return fmt::format("its record has no {} throughput", m.key);
  if (!rec["conformance"].value("measurements", nlohmann::json()).is_number_integer() ||
      !rec["conformance"].value("failed", nlohmann::json()).is_array())
    return "its record's conformance is not one";
  if (rec.contains("self_difference") && !rec["self_difference"].is_null() && !rec["self_difference"].is_object())
    return "its record's self_difference is not one";
  return "";
}

int verdict_order(const std::string& v) { return v == "failed" ? 0 : v == "wrong" ? 1 : v == "slow" ? 2 : 3; }

// One device's throughput against the other devices' of its kind: values[i] is
// slow when there are 3 devices or more and it lies below the others' median by more
// than the floor and by more than kFleetRobustZ standard deviations of the others'
// spread (1.4826 times their median absolute deviation); harness/tolerances.hpp.
struct AgainstOthers {
  double median = 0, mad = 0;  // the others'
  double deficit = 0;          // (median - value) / median
  double spread = 0;           // the others' spread as a relative deficit
  double robust_z = 0;         // infinite when the others agree exactly and this one is below
  bool slow = false;
};
AgainstOthers against_others(const std::vector<double>& values, size_t i, double floor) {
  // The median and the MAD are the others', so that a slow device cannot pull the
  // median it is judged by nor widen the spread it hides in.
  AgainstOthers a;
  const double x = values[i];
  std::vector<double> others;
  for (size_t k = 0; k < values.size(); ++k)
    if (k != i) others.push_back(values[k]);
  if (others.empty()) return a;
  a.median = median_of(others);
  std::vector<double> dev;
  for (double o : others) dev.push_back(std::fabs(o - a.median));
  a.mad = median_of(dev);
  a.deficit = a.median > 0 ? (a.median - x) / a.median : 0;
  // kFleetRobustZ standard deviations estimated from the MAD (1.4826 MAD for normal noise).
  a.spread = a.median > 0 ? tol::kFleetRobustZ * 1.4826 * a.mad / a.median : 0;
  a.robust_z = a.mad > 0 ? 0.6745 * (a.median - x) / a.mad : (x < a.median ? INFINITY : 0.0);
  a.slow = values.size() >= 3 && a.deficit > std::max(floor, a.spread);
  return a;
}

}  // namespace

std::string kind_of(const nlohmann::json& rec) {
  const nlohmann::json& d = rec.value("device", nlohmann::json::object());
  const nlohmann::json& b = rec.value("build", nlohmann::json::object());
  return fmt::format("{} | {} | {} SMs | driver {} | build {}", rec.value("backend", ""), d.value("name", "?"),
                     d.value("sm_count", 0), d.value("driver_version", 0), b.value("git_sha", "?"));
}

double slow_floor(BackendKind backend) {
  return backend == BackendKind::cuda ? tol::kFleetSlowFloorGpu : tol::kFleetSlowFloorCpu;
}

double behind_floor(BackendKind backend) {
  return backend == BackendKind::cuda ? tol::kFleetBehindGpu : tol::kFleetBehindCpu;
}

nlohmann::json judge_fleet(const std::vector<nlohmann::json>& ranks, const nlohmann::json& baseline,
                           BackendKind backend) {
  const double floor = slow_floor(backend);
  std::vector<nlohmann::json> devices;
  std::map<std::string, std::vector<size_t>> groups;  // kind -> indices of ok devices
  for (size_t r = 0; r < ranks.size(); ++r) {
    const nlohmann::json& rec = ranks[r];
    nlohmann::json d{{"rank", r}, {"checks", nlohmann::json::object()}, {"reasons", nlohmann::json::array()}};
    if (!rec.is_object()) {
      d["status"] = "failed";
      d["reasons"].push_back(
          "no record: the rank never reported (its process or node died first, or the output folder is not shared "
          "with its node)");
    } else {
      const nlohmann::json& dev = rec.value("device", nlohmann::json::object());
      d["host"] = rec.value("host", "");
      d["device_name"] = dev.value("name", "");
      d["uuid"] = dev.value("uuid", "");
      d["pci_bus_id"] = dev.value("pci_bus_id", "");
      d["ordinal"] = dev.value("ordinal", 0);
      d["sm_clock_khz"] = dev.value("sm_clock_khz", 0);
      d["memory_clock_khz"] = dev.value("memory_clock_khz", 0);
      d["driver_version"] = dev.value("driver_version", 0);
      d["build"] = rec.value("build", nlohmann::json::object()).value("git_sha", "");
      d["kind"] = kind_of(rec);
      d["seconds"] = rec.value("seconds", 0.0);
      d["status"] = rec.value("status", "failed");
      if (rec.contains("injected")) d["injected"] = rec["injected"];
      if (const std::string why = d["status"] == "ok" ? incomplete(rec) : ""; !why.empty()) {
        d["status"] = "failed";
        d["reasons"].push_back("not judged: " + why);
      }
      if (d["status"] != "ok") {
        if (rec.contains("failure") && rec["failure"].is_object()) {
          const nlohmann::json& f = rec["failure"];
          d["failure"] = f;
          d["reasons"].push_back(fmt::format("failed in {}: {}", f.value("phase", "?"), f.value("reason", "?")));
        }
        if (d["reasons"].empty()) d["reasons"].push_back("failed: its record says so without a reason");
      } else {
        groups[d["kind"].get<std::string>()].push_back(r);
      }
    }
    devices.push_back(std::move(d));
  }

  for (auto& [kind, members] : groups) {
    // The digest: the majority's value among the devices of one kind.
    std::map<std::string, size_t> count;
    for (size_t r : members) ++count[ranks[r]["digest"].value("sha256", "")];
    std::string majority;
    for (const auto& [sha, n] : count)
      if (2 * n > members.size()) majority = sha;
    for (size_t r : members) {
      nlohmann::json& d = devices[r];
      const nlohmann::json& rec = ranks[r];
      const std::string mine = rec["digest"].value("sha256", "");
      nlohmann::json dg{{"sha256", mine}, {"majority_sha256", majority.empty() ? nlohmann::json(nullptr) : nlohmann::json(majority)},
                        {"devices_of_this_kind", members.size()}, {"seconds", rec["digest"].value("seconds", 0.0)}};
      if (members.size() == 1) {
        dg["verdict"] = "alone";
        dg["note"] = "no other device of this kind, driver and build to compare with; its own repeat still is";
      } else if (majority.empty()) {
        dg["verdict"] = "fail";
        dg["note"] = "no majority: the devices of this kind split without one digest held by more than half";
        d["reasons"].push_back("digest: no majority among the devices of its kind");
      } else if (mine == majority) {
        dg["verdict"] = "pass";
      } else {
        dg["verdict"] = "fail";
        // Against a device that holds the majority's digest.
        for (size_t o : members)
          if (ranks[o]["digest"].value("sha256", "") == majority) {
            const auto diff = first_difference(rec["digest"].get<Digest>(), ranks[o]["digest"].get<Digest>());
            dg["first_difference"] = difference_json(diff);
            dg["compared_with_rank"] = o;
            if (diff)
              d["reasons"].push_back(fmt::format("digest differs from the majority's: first at {} step {}, {}",
                                                 diff->config, diff->step, diff->tensor));
            break;
          }
      }
      d["checks"]["digest"] = dg;

      const nlohmann::json& self = rec.value("self_difference", nlohmann::json());
      d["checks"]["self_repeat"] = {{"verdict", self.is_null() ? "pass" : "fail"}, {"first_difference", self}};
      if (!self.is_null())
        d["reasons"].push_back(fmt::format("differs from its own second run: first at {} step {}, {}",
                                           self.value("config", ""), self.value("step", 0), self.value("tensor", "")));

      const nlohmann::json& c = rec.value("conformance", nlohmann::json::object());
      const int measured = c.value("measurements", 0);
      const auto failed = c.value("failed", nlohmann::json::array());
      nlohmann::json cf{{"measurements", measured}, {"passed", c.value("passed", 0)},
                        {"controls_caught", c.value("controls_caught", 0)},
                        {"negative_controls", c.value("negative_controls", 0)}, {"failed", failed},
                        {"results", c.value("results", "")}};
      cf["verdict"] = measured > 0 && failed.empty() ? "pass" : "fail";
      if (measured == 0) d["reasons"].push_back("conformance: nothing was measured");
      for (const auto& f : failed) d["reasons"].push_back("conformance: " + f.get<std::string>());
      d["checks"]["conformance"] = cf;
    }

    // Throughput against the median of the other devices of its kind (with three
    // devices or more), so that a slow one does not pull the median it is judged by,
    // and against the baseline.
    for (const Metric& m : kMetrics) {
      std::vector<double> v;
      for (size_t r : members) v.push_back(ranks[r]["throughput"][m.key].value("value", 0.0));
      for (size_t i = 0; i < members.size(); ++i) {
        nlohmann::json& d = devices[members[i]];
        const nlohmann::json& t = ranks[members[i]]["throughput"];
        const double x = v[i];
        const AgainstOthers a = against_others(v, i, floor);
        const bool is_judged = judged(m, backend);
        const bool fleet_slow = is_judged && a.slow;
        nlohmann::json e{{"value", x}, {"unit", m.unit}, {"others_median", a.median}, {"others_mad", a.mad},
                         {"deficit", a.deficit}, {"spread_bound", a.spread},
                         {"robust_z", std::isfinite(a.robust_z) ? nlohmann::json(a.robust_z) : nlohmann::json("inf")},
                         {"slow_against_fleet", fleet_slow}, {"judged", is_judged}};
        const nlohmann::json conf = t.value("confirmation", nlohmann::json::object());
        const int again = conf.is_object() && conf.value("rounds", nlohmann::json()).is_number_integer()
                              ? conf["rounds"].get<int>()
                              : 0;
        const bool measured = t[m.key].value("status", "ok") == "ok";
        bool slow = fleet_slow;
        if (fleet_slow && measured)
          d["reasons"].push_back(fmt::format("slow: {} {:.4g} {}, {:.0f}% below the other devices' median {:.4g}{}",
                                             m.name, x, m.unit, 100 * a.deficit, a.median,
                                             again > 0 ? fmt::format(", also after {} more round{}", again,
                                                                     again == 1 ? "" : "s")
                                                       : ""));
        if (!is_judged) e["note"] = "CPU ranks share the machine's memory: recorded, not judged";
        if (const auto b = is_judged ? baseline_median(baseline, d.value("device_name", ""), m.key) : std::nullopt) {
          const double bdef = (*b - x) / *b;
          e["baseline_median"] = *b;
          e["deficit_against_baseline"] = bdef;
          e["slow_against_baseline"] = bdef > floor;
          if (bdef > floor)
            d["reasons"].push_back(fmt::format("slow: {} {:.4g} {}, {:.0f}% below the baseline's median {:.4g}", m.name,
                                               x, m.unit, 100 * bdef, *b));
          slow = slow || bdef > floor;
        }
        if (const nlohmann::json& p = t[m.key]; !measured) {
          slow = true;
          d["reasons"].push_back(fmt::format("slow: {} not measured ({}): {}", m.name, p.value("status", "?"),
                                             p.value("reason", "no reason recorded")));
        }
        e["slow"] = slow;
        d["checks"]["throughput"]["metrics"][m.key] = e;
      }
    }
    for (size_t r : members) {
      nlohmann::json& d = devices[r];
      bool slow = false;
      for (const Metric& m : kMetrics) slow = slow || d["checks"]["throughput"]["metrics"][m.key].value("slow", false);
      d["checks"]["throughput"]["verdict"] = slow ? "fail" : "pass";
      d["checks"]["throughput"]["floor"] = floor;
      d["checks"]["throughput"]["rule"] = tol::kFleetSlowReason;
      if (const auto& conf = ranks[r]["throughput"].value("confirmation", nlohmann::json()); conf.is_object())
        d["checks"]["throughput"]["confirmation"] = conf;
      if (members.size() < 3) d["checks"]["throughput"]["note"] = "fewer than 3 devices of this kind: against the baseline only";
    }
  }

  int counts[4] = {0, 0, 0, 0};
  for (nlohmann::json& d : devices) {
    std::string v = "ok";
    if (d["status"] != "ok") {
      v = "failed";
    } else {
      const auto& c = d["checks"];
      if (c["digest"]["verdict"] == "fail" || c["self_repeat"]["verdict"] == "fail" || c["conformance"]["verdict"] == "fail")
        v = "wrong";
      else if (c["throughput"]["verdict"] == "fail")
        v = "slow";
    }
    d["verdict"] = v;
    ++counts[verdict_order(v)];
  }
  std::stable_sort(devices.begin(), devices.end(), [](const nlohmann::json& a, const nlohmann::json& b) {
    return verdict_order(a["verdict"]) < verdict_order(b["verdict"]);
  });
  nlohmann::json j{{"schema", kFleetSchema},
                   {"devices", devices},
                   {"summary",
                    {{"devices", ranks.size()}, {"ok", counts[3]}, {"slow", counts[2]}, {"wrong", counts[1]},
                     {"failed", counts[0]}}}};
  j["verdict"] = counts[3] == static_cast<int>(ranks.size()) && !ranks.empty() ? "pass" : "fail";
  return j;
}

std::string fleet_junit(const nlohmann::json& fleet) {
  auto xml = [](std::string s) {
    for (char& ch : s)
      if (static_cast<unsigned char>(ch) < 0x20 && ch != '\t' && ch != '\n' && ch != '\r') ch = '?';
    return report::esc(s);
  };
  std::string cases;
  int tests = 0, failures = 0;
  for (const auto& d : fleet.value("devices", nlohmann::json::array())) {
    const std::string cls = fmt::format("fleet.rank_{}", d.value("rank", 0));
    const std::string who = fmt::format("rank {} {} {}", d.value("rank", 0), d.value("host", ""), d.value("device_name", ""));
    auto add = [&](const std::string& check, bool ok, const std::string& why) {
      ++tests;
      cases += fmt::format(R"(  <testcase classname="{}" name="{}">)", xml(cls), xml(check + " " + who));
      if (!ok) {
        ++failures;
        cases += fmt::format(R"(<failure message="{}"/>)", xml(why));
      }
      cases += "</testcase>\n";
    };
    std::string all;
    for (const auto& r : d.value("reasons", nlohmann::json::array())) all += (all.empty() ? "" : "; ") + r.get<std::string>();
    if (d.value("status", "") != "ok") {
      add("runs", false, all);
      continue;
    }
    add("runs", true, "");
    for (const char* check : {"digest", "self_repeat", "conformance", "throughput"}) {
      const std::string v = d["checks"][check].value("verdict", "");
      add(check, v != "fail", all);
    }
  }
  return fmt::format("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuites><testsuite name=\"headroom fleet\" "
                     "tests=\"{}\" failures=\"{}\">\n{}</testsuite></testsuites>\n",
                     tests, failures, cases);
}

}  // namespace hr::fleet
