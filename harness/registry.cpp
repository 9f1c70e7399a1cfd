// Property and sweep registries, and their JSON form.
#include "harness/registry.hpp"

#include <cmath>

#include "harness/check.hpp"
#include "harness/tolerances.hpp"

namespace hr {

Measurement make_check(std::string id, std::string title, double error, double tolerance) {
  Measurement m;
  m.id = std::move(id);
  m.title = std::move(title);
  m.error = error;
  m.tolerance = tolerance;
  m.passed = std::isfinite(error) && error <= tolerance;
  return m;
}

namespace {
// What power is measured in: the bound, or for a bound of zero (a real-valued exact
// check) the metric's own unit (Measurement::power).
double power_unit(double tolerance) { return tolerance > 0 ? tolerance : 1.0; }
}  // namespace

std::string check_name(const std::string& id, const std::string& title) { return id + ": " + title; }

Measurement make_negative_control(std::string id, std::string title, double error, double tolerance,
                                  std::string of) {
  Measurement m = make_check(std::move(id), std::move(title), error, tolerance);
  m.control_of = std::move(of);
  m.negative_control = true;
  m.control = "gross";
  m.passed = std::isfinite(error) && error > tolerance;
  if (m.passed) m.power = error / power_unit(tolerance);
  if (!std::isfinite(error))
    m.details["not_caught"] = "the broken variant gave a non-finite error; a control must be caught by a finite one";
  return m;
}

Measurement make_subtle_control(std::string id, std::string title, double error, double tolerance,
                                 std::string of) {
  Measurement m = make_negative_control(std::move(id), std::move(title), error, tolerance, std::move(of));
  m.control = "subtle";
  if (m.passed && !(error <= tol::kSubtleControlMaxPower * power_unit(tolerance))) {
    m.passed = false;
    m.details["not_caught"] = fmt::format("error {:.3g} is {:.3g} times the bound: a subtle control must lie within "
                                          "{:g} times it (harness/tolerances.hpp kSubtleControlMaxPower)",
                                          error, error / tolerance, tol::kSubtleControlMaxPower);
  }
  return m;
}

std::string default_check_key(const Measurement& m) {
  std::string where;
  for (const std::string* part : {&m.backend, &m.dtype, &m.model})
    if (!part->empty()) where += (where.empty() ? "" : " ") + *part;
  std::string cfg;
  if (m.config.is_object()) {
    for (auto it = m.config.begin(); it != m.config.end(); ++it)
      cfg += (cfg.empty() ? "" : " ") + it.key() + "=" + (it->is_string() ? it->get<std::string>() : it->dump());
  }
  return fmt::format("{} | {} | {} | {}{}", m.id, where, cfg, m.negative_control ? m.control + " control: " : "",
                     m.title);
}

const char* preset_name(Preset p) { return p == Preset::quick ? "quick" : "full"; }

Preset parse_preset(const std::string& s) {
  if (s == "quick") return Preset::quick;
  if (s == "full") return Preset::full;
  throw InvalidArgument(fmt::format("unknown preset '{}' (expected quick or full)", s));
}

std::vector<PropertySpec>& property_registry() {
  static std::vector<PropertySpec> r;
  return r;
}
std::vector<SweepSpec>& sweep_registry() {
  static std::vector<SweepSpec> r;
  return r;
}
Registrar::Registrar(PropertySpec s) { property_registry().push_back(std::move(s)); }
Registrar::Registrar(SweepSpec s) { sweep_registry().push_back(std::move(s)); }

void to_json(nlohmann::json& j, const MemorySnapshot& m) {
  nlohmann::json cur = nlohmann::json::object(), peak = nlohmann::json::object();
  for (Consumer c : kAllConsumers) {
    cur[consumer_name(c)] = m.current(c);
    peak[consumer_name(c)] = m.peak(c);
  }
  j = nlohmann::json{{"current_bytes", cur}, {"peak_bytes", peak},
                     {"total_current_bytes", m.total_current_bytes}, {"total_peak_bytes", m.total_peak_bytes}};
}

void to_json(nlohmann::json& j, const Measurement& m) {
  j = nlohmann::json{{"id", m.id},
                     {"title", m.title},
                     {"backend", m.backend},
                     {"dtype", m.dtype},
                     {"model", m.model},
                     {"config", m.config},
                     {"metric", m.metric},
                     {"error", json_number(m.error)},
                     {"tolerance", json_number(m.tolerance)},
                     {"negative_control", m.negative_control},
                     {"control", m.control},
                     {"passed", m.passed},
                     {"check", m.check.empty() ? default_check_key(m) : m.check},
                     {"tolerance_reason", m.tolerance_reason},
                     {"details", m.details}};
  if (m.power) j["power"] = json_number(*m.power);
  if (!m.control_of.empty()) j["control_of"] = m.control_of;
}

void to_json(nlohmann::json& j, const SweepPoint& p) {
  j = nlohmann::json{{"sweep", p.sweep},   {"backend", p.backend}, {"dtype", p.dtype},
                     {"model", p.model},   {"config", p.config},   {"status", p.status},
                     {"reason", p.reason}, {"memory", p.memory},   {"metrics", p.metrics}};
  if (p.time) j["time"] = *p.time;
}

}  // namespace hr
