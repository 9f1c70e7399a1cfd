// results.json: writing (atomic, non-finite numbers explicit) and loading (schema
// checked, every field read validated) for the run, the report and comparisons.
#include "harness/results/results.hpp"

#include <fmt/format.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <algorithm>

#include <chrono>

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness/build_info.hpp"
#include "harness/check.hpp"
#include "harness/output.hpp"
#include "harness/tolerances.hpp"
#include "kernels/attention/attention.hpp"

namespace hr {

void compute_totals(Results& r) {
  RunTotals t;
  for (const auto& m : r.measurements) {
    ++t.measurements;
    (m.passed ? t.passed : t.failed) += 1;
    if (is_error_measurement(m)) ++t.errors;
    if (m.negative_control) {
      ++t.negative_controls;
      if (m.passed) ++t.negative_controls_caught;
    }
    if (m.control == "subtle") {
      ++t.subtle_controls;
      if (m.passed) ++t.subtle_controls_caught;
    }
  }
  for (const auto& p : r.sweep_points) {
    ++t.sweep_points;
    if (p.status == "ok") ++t.sweep_points_ok;
    else if (p.status == "out_of_memory") ++t.sweep_points_out_of_memory;
    else if (p.status == "skipped") ++t.sweep_points_skipped;
    else ++t.sweep_points_error;
  }
  for (const auto& s : r.timings)
    if (!s.skipped.empty()) ++t.specs_skipped;
  r.totals = t;
}

std::string run_kind(const Results& r) {
  if (r.incomplete) return "interrupted";
  int errors = 0, measured = 0;
  for (const auto& m : r.measurements) {
    if (is_error_measurement(m)) ++errors;
    else ++measured;
  }
  for (const auto& p : r.sweep_points) {
    if (p.status == "error") ++errors;
    else if (p.status == "ok") ++measured;
  }
  if (errors > 0) return "with errors";
  if (measured == 0) return "empty";
  if (!r.only.empty() || !r.skip.empty()) return "partial";
  return "complete";
}

bool HostLoad::busy() const {
  return (cpus > 0 && other_busy_cpus >= kBusyHostFraction * cpus) || steal_fraction >= kBusyHostSteal;
}

HostSample sample_host() {
  HostSample h;
  h.wall = std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  h.cpus = static_cast<int>(::sysconf(_SC_NPROCESSORS_ONLN));
  const double tick = static_cast<double>(::sysconf(_SC_CLK_TCK));
  if (std::FILE* f = std::fopen("/proc/stat", "r")) {
    // cpu  user nice system idle iowait irq softirq steal guest guest_nice
    unsigned long long v[8] = {};
    if (std::fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5], &v[6],
                    &v[7]) == 8 && tick > 0) {
      double total = 0;
      for (unsigned long long x : v) total += static_cast<double>(x);
      h.total_s = total / tick;
      h.busy_s = static_cast<double>(v[0] + v[1] + v[2] + v[5] + v[6]) / tick;
      h.steal_s = static_cast<double>(v[7]) / tick;
      h.stat_ok = true;
    }
    std::fclose(f);
  }
  if (std::FILE* f = std::fopen("/proc/loadavg", "r")) {
    double l = -1;
    if (std::fscanf(f, "%lf", &l) == 1) h.load_avg = l;
    std::fclose(f);
  }
  struct rusage ru {};
  if (::getrusage(RUSAGE_SELF, &ru) == 0)
    h.own_cpu_s = static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
                  1e-6 * static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
  return h;
}

HostLoad host_load_since(const HostSample& a) {
  const HostSample b = sample_host();
  HostLoad h;
  h.cpus = b.cpus;
  h.load_avg_start = a.load_avg;
  h.load_avg_end = b.load_avg;
  h.wall_s = b.wall - a.wall;
  if (a.stat_ok && b.stat_ok && h.wall_s > 0) {
    // Children (the data-parallel ranks) count as other work here: they are not this
    // process, and they take the cores the timed steps would use.
    h.other_busy_cpus = std::max(0.0, (b.busy_s - a.busy_s) - (b.own_cpu_s - a.own_cpu_s)) / h.wall_s;
    const double total = b.total_s - a.total_s;
    h.steal_fraction = total > 0 ? (b.steal_s - a.steal_s) / total : 0.0;
  }
  return h;
}

nlohmann::json host_load_to_json(const HostLoad& h) {
  return nlohmann::json{{"cpus", h.cpus},
                        {"load_avg_start", json_number(h.load_avg_start)},
                        {"load_avg_end", json_number(h.load_avg_end)},
                        {"other_busy_cpus", json_number(h.other_busy_cpus)},
                        {"steal_fraction", json_number(h.steal_fraction)},
                        {"wall_s", json_number(h.wall_s)},
                        {"busy", h.busy()}};
}

nlohmann::json build_record() {
  return nlohmann::json{{"git_sha", build::git_sha()},
                        {"version", build::kVersion},
                        {"cxx_compiler", build::kCxxCompiler},
                        {"cuda_compiler", build::kCudaCompiler},
                        {"cuda_archs", build::kCudaArchs},
                        {"build_type", build::kBuildType},
                        {"cuda_backend", HEADROOM_HAVE_CUDA != 0}};
}

std::string utc_now_iso8601() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

bool is_error_measurement(const Measurement& m) {
  return m.metric == "exception" && m.details.is_object() && m.details.contains("error");
}

Measurement make_error_measurement(const std::string& id, const std::string& title,
                                   const std::string& backend, const std::string& reason) {
  Measurement m;
  m.id = id;
  m.title = title;
  m.backend = backend;
  m.metric = "exception";
  m.error = std::nan("");
  m.tolerance = 0;
  m.passed = false;
  m.tolerance_reason = "the property threw before it could measure anything";
  m.details = nlohmann::json{{"error", reason}};
  return m;
}

void make_non_finite_explicit(nlohmann::json& j) {
  if (j.is_number_float()) {
    const double v = j.get<double>();
    if (!std::isfinite(v)) j = json_number(v);
  } else if (j.is_structured()) {
    for (auto& e : j) make_non_finite_explicit(e);
  }
}

namespace {

nlohmann::json totals_to_json(const RunTotals& t) {
  return nlohmann::json{{"measurements", t.measurements},
                        {"passed", t.passed},
                        {"failed", t.failed},
                        {"errors", t.errors},
                        {"negative_controls", t.negative_controls},
                        {"negative_controls_caught", t.negative_controls_caught},
                        {"subtle_controls", t.subtle_controls},
                        {"subtle_controls_caught", t.subtle_controls_caught},
                        {"sweep_points", t.sweep_points},
                        {"sweep_points_ok", t.sweep_points_ok},
                        {"sweep_points_out_of_memory", t.sweep_points_out_of_memory},
                        {"sweep_points_skipped", t.sweep_points_skipped},
                        {"sweep_points_error", t.sweep_points_error},
                        {"specs_skipped", t.specs_skipped}};
}

// Field readers that name the field and the source when it is missing or mistyped.
const nlohmann::json& field(const nlohmann::json& j, const char* key, const std::string& where) {
  HR_ARG_CHECK(j.is_object(), "{}: expected an object", where);
  auto it = j.find(key);
  HR_ARG_CHECK(it != j.end(), "{}: missing field \"{}\"", where, key);
  return *it;
}

std::string str_field(const nlohmann::json& j, const char* key, const std::string& where) {
  const auto& v = field(j, key, where);
  HR_ARG_CHECK(v.is_string(), "{}: field \"{}\" must be a string, got {}", where, key, v.dump());
  return v.get<std::string>();
}

std::string opt_str(const nlohmann::json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
}

double num_field(const nlohmann::json& j, const char* key, const std::string& where) {
  const auto& v = field(j, key, where);
  try {
    return json_to_double(v);
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(fmt::format("{}: field \"{}\": {}", where, key, e.what()));
  }
}

double opt_num(const nlohmann::json& j, const char* key, double dflt = 0) {
  auto it = j.find(key);
  if (it == j.end()) return dflt;
  return json_to_double(*it);
}

bool bool_field(const nlohmann::json& j, const char* key, const std::string& where) {
  const auto& v = field(j, key, where);
  HR_ARG_CHECK(v.is_boolean(), "{}: field \"{}\" must be true or false, got {}", where, key, v.dump());
  return v.get<bool>();
}

nlohmann::json obj_or_empty(const nlohmann::json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_object() ? *it : nlohmann::json::object();
}

TimeStats time_from_json(const nlohmann::json& j, const std::string& where) {
  TimeStats t;
  t.reps = static_cast<int>(opt_num(j, "reps"));
  t.median_s = num_field(j, "median_s", where);
  t.mean_s = opt_num(j, "mean_s");
  t.min_s = opt_num(j, "min_s");
  t.max_s = opt_num(j, "max_s");
  t.stddev_s = opt_num(j, "stddev_s");
  t.mad_s = opt_num(j, "mad_s");
  t.rel_spread = opt_num(j, "rel_spread");
  auto it = j.find("noisy");
  t.noisy = it != j.end() && it->is_boolean() ? it->get<bool>() : t.rel_spread > kNoisyRelSpread;
  // The samples, when recorded (files written before they were have only the summary).
  auto samples = j.find("samples_s");
  if (samples != j.end() && samples->is_array())
    for (const auto& v : *samples) t.samples_s.push_back(json_to_double(v));
  auto cpu_samples = j.find("cpu_samples_s");
  if (cpu_samples != j.end() && cpu_samples->is_array())
    for (const auto& v : *cpu_samples) t.cpu_samples_s.push_back(json_to_double(v));
  auto ref_samples = j.find("ref_cpu_samples_s");
  if (ref_samples != j.end() && ref_samples->is_array())
    for (const auto& v : *ref_samples) t.ref_cpu_samples_s.push_back(json_to_double(v));
  auto ref_work = j.find("ref_work");
  if (ref_work != j.end()) {
    HR_ARG_CHECK(ref_work->is_string() && !ref_work->get<std::string>().empty(),
                 "{}: ref_work must name the reference work, got {}", where, ref_work->dump());
    HR_ARG_CHECK(!t.ref_cpu_samples_s.empty(), "{}: ref_work names a reference work but there are no reference samples",
                 where);
    t.ref_work = ref_work->get<std::string>();
  }
  auto calls = j.find("kernel_calls");
  if (calls != j.end()) {
    HR_ARG_CHECK(calls->is_object(), "{}: kernel_calls must map kernel names to calls per run, got {}", where,
                 calls->dump());
    for (const auto& [name, n] : calls->items()) {
      const double v = n.is_number() ? n.get<double>() : -1.0;
      HR_ARG_CHECK(!name.empty() && std::isfinite(v) && v > 0,
                   "{}: kernel_calls[\"{}\"] must be a positive number of calls per run, got {}", where, name,
                   n.dump());
      t.kernel_calls[name] = v;
    }
  }
  auto fell = j.find("kernel_fallbacks");
  if (fell != j.end()) {
    HR_ARG_CHECK(fell->is_object(), "{}: kernel_fallbacks must map the kernels asked for to why they did not run, got {}",
                 where, fell->dump());
    for (const auto& [name, why] : fell->items()) {
      HR_ARG_CHECK(why.is_string() && !why.get<std::string>().empty(),
                   "{}: kernel_fallbacks[\"{}\"] must say why the kernel did not run, got {}", where, name, why.dump());
      // "op:variant", of an op whose calls ran another variant.
      const auto colon = name.find(':');
      HR_ARG_CHECK(colon != std::string::npos && colon > 0 && colon + 1 < name.size(),
                   "{}: kernel_fallbacks[\"{}\"]: a kernel asked for is named op:variant", where, name);
      const std::string op = name.substr(0, colon + 1);
      const bool ran = std::any_of(t.kernel_calls.begin(), t.kernel_calls.end(),
                                   [&](const auto& c) { return c.first.rfind(op, 0) == 0; });
      HR_ARG_CHECK(ran, "{}: kernel_fallbacks[\"{}\"]: no kernel_calls of {}* say what ran instead", where, name, op);
      t.kernel_fallbacks[name] = why.get<std::string>();
    }
  }
  auto ops = j.find("op_seconds");
  if (ops != j.end()) {
    HR_ARG_CHECK(ops->is_object(), "{}: op_seconds must map op names to seconds, got {}", where, ops->dump());
    for (const auto& [name, s] : ops->items()) {
      const double v = s.is_number() ? s.get<double>() : -1.0;
      HR_ARG_CHECK(!name.empty() && std::isfinite(v) && v >= 0,
                   "{}: op_seconds[\"{}\"] must be a finite number of seconds >= 0, got {}", where, name, s.dump());
      t.op_seconds[name] = v;
    }
  }
  // Values no timer gives: a time that hides a slowdown (0, negative, NaN) would
  // otherwise be left out of every comparison.
  auto positive = [&](double v, const char* what) {
    HR_ARG_CHECK(std::isfinite(v) && v > 0, "{}: {} is {}: a measured time is a positive, finite number of seconds",
                 where, what, json_number(v).dump());
  };
  positive(t.median_s, "median_s");
  for (const auto* list : {&t.samples_s, &t.cpu_samples_s, &t.ref_cpu_samples_s})
    for (double v : *list) positive(v, list == &t.samples_s ? "a sample" : list == &t.cpu_samples_s ? "a CPU-time sample" : "a reference sample");
  HR_ARG_CHECK(t.samples_s.empty() || static_cast<size_t>(t.reps) == t.samples_s.size(),
               "{}: inconsistent: reps is {} but samples_s holds {} samples", where, t.reps, t.samples_s.size());
  HR_ARG_CHECK(t.cpu_samples_s.empty() || t.cpu_samples_s.size() == t.samples_s.size(),
               "{}: inconsistent: {} CPU-time samples for {} samples", where, t.cpu_samples_s.size(),
               t.samples_s.size());
  HR_ARG_CHECK(t.ref_cpu_samples_s.empty() || t.ref_cpu_samples_s.size() == t.cpu_samples_s.size(),
               "{}: inconsistent: {} reference samples for {} CPU-time samples", where, t.ref_cpu_samples_s.size(),
               t.cpu_samples_s.size());
  if (!t.samples_s.empty()) {
    // The summary is of the samples: a median that is not theirs would be judged
    // in their place (a slowdown in the samples hidden by the summary), so it is
    // refused, and the rest of the summary (the spread, "noisy") is taken from
    // the samples rather than from what the file says of them.
    TimeStats s = summarize_times(t.samples_s);
    HR_ARG_CHECK(std::fabs(t.median_s - s.median_s) <= 1e-9 * s.median_s,
                 "{}: inconsistent: median_s is {} but the median of its {} samples is {}", where,
                 json_number(t.median_s).dump(), s.samples_s.size(), json_number(s.median_s).dump());
    s.cpu_samples_s = std::move(t.cpu_samples_s);
    s.ref_cpu_samples_s = std::move(t.ref_cpu_samples_s);
    s.ref_work = std::move(t.ref_work);
    s.kernel_calls = std::move(t.kernel_calls);
    s.kernel_fallbacks = std::move(t.kernel_fallbacks);
    s.op_seconds = std::move(t.op_seconds);
    return s;
  }
  return t;
}

// A byte count as the tracker writes it: a whole number from 0 to 2^53 (beyond it
// a double no longer holds every integer, and no device has that much memory).
size_t byte_count(const nlohmann::json& v, const std::string& where, const std::string& what) {
  double d = NAN;
  try {
    d = json_to_double(v);
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(fmt::format("{}: {}: {}", where, what, e.what()));
  }
  HR_ARG_CHECK(std::isfinite(d) && d >= 0 && d <= 9007199254740992.0 && std::floor(d) == d,
               "{}: {} is {}: a byte count is a whole number from 0 to 2^53", where, what, v.dump());
  return static_cast<size_t>(d);
}

MemorySnapshot memory_from_json(const nlohmann::json& j, const std::string& where) {
  MemorySnapshot m;
  if (!j.is_object()) return m;
  const auto cur = obj_or_empty(j, "current_bytes"), peak = obj_or_empty(j, "peak_bytes");
  for (Consumer c : kAllConsumers) {
    const int i = static_cast<int>(c);
    const std::string name = consumer_name(c);
    if (cur.contains(name)) m.current_bytes[i] = byte_count(cur[name], where, "current_bytes." + name);
    if (peak.contains(name)) m.peak_bytes[i] = byte_count(peak[name], where, "peak_bytes." + name);
  }
  if (j.contains("total_current_bytes"))
    m.total_current_bytes = byte_count(j["total_current_bytes"], where, "total_current_bytes");
  if (j.contains("total_peak_bytes")) m.total_peak_bytes = byte_count(j["total_peak_bytes"], where, "total_peak_bytes");
  return m;
}

}  // namespace

Measurement measurement_from_json(const nlohmann::json& j) {
  const std::string where = fmt::format("measurement {}", j.is_object() ? opt_str(j, "id") : j.dump());
  Measurement m;
  m.id = str_field(j, "id", where);
  m.title = opt_str(j, "title");
  m.backend = opt_str(j, "backend");
  m.dtype = opt_str(j, "dtype");
  m.model = opt_str(j, "model");
  m.config = obj_or_empty(j, "config");
  m.metric = opt_str(j, "metric");
  m.error = num_field(j, "error", where);
  m.tolerance = num_field(j, "tolerance", where);
  // A bound no check has: an infinite or negative one would pass (or catch) anything.
  HR_ARG_CHECK(std::isfinite(m.tolerance) && m.tolerance >= 0,
               "{}: tolerance is {}: a bound is a finite number of at least 0", where, json_number(m.tolerance).dump());
  m.negative_control = bool_field(j, "negative_control", where);
  m.control = opt_str(j, "control");
  if (m.negative_control && m.control.empty()) m.control = "gross";  // written before the field existed
  if (!m.negative_control && !m.control.empty())
    throw InvalidArgument(fmt::format("{}: \"control\" is '{}' on a measurement that is not a negative control",
                                      where, m.control));
  if (!m.control.empty() && m.control != "gross" && m.control != "subtle")
    throw InvalidArgument(fmt::format("{}: \"control\" must be \"gross\" or \"subtle\", got '{}'", where, m.control));
  if (j.contains("power")) m.power = num_field(j, "power", where);
  m.control_of = opt_str(j, "control_of");
  if (!m.negative_control && !m.control_of.empty())
    throw InvalidArgument(fmt::format("{}: \"control_of\" is '{}' on a measurement that is not a negative control",
                                      where, m.control_of));
  m.passed = bool_field(j, "passed", where);
  // The verdict is recomputed, not trusted: a stored verdict that the error and the
  // tolerance do not support means the file was edited or is corrupt.
  const bool verdict = recomputed_verdict(m);
  if (m.passed != verdict)
    throw InvalidArgument(fmt::format(
        "{}: inconsistent: stored \"passed\": {} but error {} against tolerance {} gives {} ({})", where,
        m.passed, json_number(m.error).dump(), json_number(m.tolerance).dump(), verdict,
        m.negative_control ? "a control is caught when its error is finite and above the tolerance"
                           : "a check passes when its error is finite and at most the tolerance"));
  m.tolerance_reason = opt_str(j, "tolerance_reason");
  m.details = obj_or_empty(j, "details");
  m.check = opt_str(j, "check");
  if (m.check.empty()) m.check = default_check_key(m);  // written before the field existed
  return m;
}

SweepPoint sweep_point_from_json(const nlohmann::json& j) {
  const std::string where = fmt::format("sweep point {}", j.is_object() ? opt_str(j, "sweep") : j.dump());
  SweepPoint p;
  p.sweep = str_field(j, "sweep", where);
  p.backend = opt_str(j, "backend");
  p.dtype = opt_str(j, "dtype");
  p.model = opt_str(j, "model");
  p.config = obj_or_empty(j, "config");
  p.status = str_field(j, "status", where);
  HR_ARG_CHECK(p.status == "ok" || p.status == "out_of_memory" || p.status == "skipped" || p.status == "error",
               "{}: status '{}' is not one of ok, out_of_memory, skipped, error", where, p.status);
  p.reason = opt_str(j, "reason");
  if (j.contains("time") && !j["time"].is_null()) {
    HR_ARG_CHECK(j["time"].is_object(), "{}: field \"time\" must be an object", where);
    p.time = time_from_json(j["time"], where + " time");
  }
  if (j.contains("memory")) p.memory = memory_from_json(j["memory"], where + " memory");
  p.metrics = obj_or_empty(j, "metrics");
  return p;
}

namespace {
// The variants of one direction's attention kernels ("attention_forward:").
std::set<std::string> attention_variants_of(const std::map<std::string, double>& calls, const std::string& prefix) {
  std::set<std::string> v;
  for (const auto& [name, n] : calls)
    if (name.rfind(prefix, 0) == 0 && name.size() > prefix.size()) v.insert(name.substr(prefix.size()));
  return v;
}
}  // namespace

std::set<std::string> attention_variants(const SweepPoint& p) {
  if (!p.time) return {};
  std::set<std::string> v = attention_variants_of(p.time->kernel_calls, "attention_forward:");
  for (const std::string& b : attention_variants_of(p.time->kernel_calls, "attention_backward:")) v.insert(b);
  return v;
}

std::string attention_kernels_label(const SweepPoint& p) {
  return p.time ? attention_kernels_label(p.time->kernel_calls) : "";
}

std::string attention_kernels_label(const std::map<std::string, double>& kernel_calls) {
  const std::set<std::string> fwd = attention_variants_of(kernel_calls, "attention_forward:"),
                              bwd = attention_variants_of(kernel_calls, "attention_backward:");
  if (fwd == bwd) return fmt::format("{}", fmt::join(fwd, "+"));
  std::vector<std::string> parts;
  if (!fwd.empty()) parts.push_back(fmt::format("forward {}", fmt::join(fwd, "+")));
  if (!bwd.empty()) parts.push_back(fmt::format("backward {}", fmt::join(bwd, "+")));
  return fmt::format("{}", fmt::join(parts, ", "));
}

std::string attention_fallbacks_label(const SweepPoint& p) {
  if (!p.time) return "";
  // variant asked -> why, per direction
  std::map<std::string, std::string> fwd, bwd;
  for (const auto& [name, why] : p.time->kernel_fallbacks) {
    const auto take = [&, &name = name, &why = why](const std::string& prefix, std::map<std::string, std::string>& into) {
      if (name.rfind(prefix, 0) == 0 && name.size() > prefix.size()) into[name.substr(prefix.size())] = why;
    };
    take("attention_forward:", fwd);
    take("attention_backward:", bwd);
  }
  auto say = [](const std::map<std::string, std::string>& m, const char* direction) {
    std::vector<std::string> parts;
    for (const auto& [variant, why] : m) parts.push_back(fmt::format("{}{} asked: {}", direction, variant, why));
    return fmt::format("{}", fmt::join(parts, "; "));
  };
  if (fwd == bwd) return say(fwd, "");
  std::vector<std::string> parts;
  if (!fwd.empty()) parts.push_back(say(fwd, "forward "));
  if (!bwd.empty()) parts.push_back(say(bwd, "backward "));
  return fmt::format("{}", fmt::join(parts, "; "));
}

nlohmann::json results_to_json(const Results& r) {
  nlohmann::json j;
  j["schema"] = r.schema;
  j["run_time_utc"] = r.run_time_utc;
  j["duration_s"] = json_number(r.duration_s);
  j["preset"] = r.preset;
  j["backend"] = r.backend;
  j["seed"] = r.seed;
  j["only"] = r.only;
  j["skip"] = r.skip;
  if (!r.dp_ranks.empty()) j["dp_ranks"] = r.dp_ranks;
  if (!r.attention_kernel.empty()) j["attention_kernel"] = r.attention_kernel;
  j["device"] = r.device;
  j["build"] = r.build;
  j["totals"] = totals_to_json(r.totals);
  j["measurements"] = nlohmann::json::array();
  for (const auto& m : r.measurements) j["measurements"].push_back(m);
  j["sweep_points"] = nlohmann::json::array();
  for (const auto& p : r.sweep_points) j["sweep_points"].push_back(p);
  j["timings"] = nlohmann::json::array();
  for (const auto& t : r.timings) {
    nlohmann::json tj{{"kind", t.kind},       {"id", t.id},
                      {"title", t.title},     {"seconds", json_number(t.seconds)},
                      {"expected_seconds_quick", json_number(t.expected_seconds_quick)},
                      {"items", t.items}};
    if (!t.error.empty()) tj["error"] = t.error;
    if (!t.skipped.empty()) tj["skipped"] = t.skipped;
    j["timings"].push_back(std::move(tj));
  }
  if (r.host) j["host"] = host_load_to_json(*r.host);
  if (r.incomplete) {
    j["incomplete"] = true;
    j["not_run"] = r.not_run;
  }
  make_non_finite_explicit(j);
  return j;
}

Results results_from_json(const nlohmann::json& j, const std::string& what) {
  HR_ARG_CHECK(j.is_object(), "{}: not a headroom results file (expected a JSON object)", what);
  auto sit = j.find("schema");
  HR_ARG_CHECK(sit != j.end() && sit->is_string(),
               "{}: not a headroom results file (no \"schema\" field; expected \"{}\")", what, kResultsSchema);
  const std::string schema = sit->get<std::string>();
  if (schema != kResultsSchema) {
    if (schema.rfind("headroom.results/", 0) == 0)
      throw InvalidArgument(fmt::format(
          "{}: results schema \"{}\" is not supported: this headroom reads \"{}\" only. "
          "Produce the file again with this version of headroom (or compare with the "
          "version that wrote it).",
          what, schema, kResultsSchema));
    throw InvalidArgument(fmt::format("{}: not a headroom results file (schema \"{}\", expected \"{}\")", what,
                                      schema, kResultsSchema));
  }
  Results r;
  r.schema = schema;
  r.run_time_utc = str_field(j, "run_time_utc", what);
  r.duration_s = opt_num(j, "duration_s");
  r.preset = str_field(j, "preset", what);
  r.backend = str_field(j, "backend", what);
  const auto& seed = field(j, "seed", what);
  // An integer in [0, 2^64 - 1], as --seed takes it: -1 is not the seed 2^64 - 1.
  HR_ARG_CHECK(seed.is_number_unsigned() || (seed.is_number_integer() && seed.get<int64_t>() >= 0),
               "{}: field \"seed\" must be an integer in [0, 2^64 - 1], got {}", what, seed.dump());
  r.seed = seed.get<uint64_t>();
  r.only = opt_str(j, "only");
  r.skip = opt_str(j, "skip");
  if (j.contains("dp_ranks")) {
    const auto& ranks = j.at("dp_ranks");
    HR_ARG_CHECK(ranks.is_array(), "{}: field \"dp_ranks\" must be an array of rank counts", what);
    for (const auto& n : ranks) {
      HR_ARG_CHECK(n.is_number_integer() && n.get<int64_t>() >= 2 && n.get<int64_t>() <= 1024,
                   "{}: field \"dp_ranks\" holds {}, not a rank count in [2, 1024]", what, n.dump());
      r.dp_ranks.push_back(n.get<int>());
    }
  }
  r.attention_kernel = opt_str(j, "attention_kernel");
  HR_ARG_CHECK(r.attention_kernel.empty() || ops::parse_gpu_attention_kernel(r.attention_kernel).has_value(),
               "{}: field \"attention_kernel\" is '{}', not scalar, tensor_core or cudnn", what, r.attention_kernel);
  r.device = field(j, "device", what);
  HR_ARG_CHECK(r.device.is_object(), "{}: field \"device\" must be an object", what);
  r.build = obj_or_empty(j, "build");
  const auto& ms = field(j, "measurements", what);
  HR_ARG_CHECK(ms.is_array(), "{}: field \"measurements\" must be an array", what);
  for (const auto& m : ms) r.measurements.push_back(measurement_from_json(m));
  const auto& ps = field(j, "sweep_points", what);
  HR_ARG_CHECK(ps.is_array(), "{}: field \"sweep_points\" must be an array", what);
  for (const auto& p : ps) r.sweep_points.push_back(sweep_point_from_json(p));
  if (j.contains("timings") && j["timings"].is_array()) {
    for (const auto& t : j["timings"]) {
      if (!t.is_object()) continue;
      SpecTiming s;
      s.kind = opt_str(t, "kind");
      s.id = opt_str(t, "id");
      s.title = opt_str(t, "title");
      s.seconds = opt_num(t, "seconds");
      s.expected_seconds_quick = opt_num(t, "expected_seconds_quick");
      s.items = static_cast<int>(opt_num(t, "items"));
      s.error = opt_str(t, "error");
      s.skipped = opt_str(t, "skipped");
      r.timings.push_back(std::move(s));
    }
  }
  if (auto h = j.find("host"); h != j.end() && h->is_object()) {
    HostLoad hl;
    hl.cpus = static_cast<int>(opt_num(*h, "cpus"));
    hl.load_avg_start = opt_num(*h, "load_avg_start", -1);
    hl.load_avg_end = opt_num(*h, "load_avg_end", -1);
    hl.other_busy_cpus = opt_num(*h, "other_busy_cpus", -1);
    hl.steal_fraction = opt_num(*h, "steal_fraction", -1);
    hl.wall_s = opt_num(*h, "wall_s");
    r.host = hl;
  }
  if (auto inc = j.find("incomplete"); inc != j.end()) {
    HR_ARG_CHECK(inc->is_boolean(), "{}: field \"incomplete\" must be true or false", what);
    r.incomplete = inc->get<bool>();
    if (auto nr = j.find("not_run"); nr != j.end()) {
      HR_ARG_CHECK(nr->is_array(), "{}: field \"not_run\" must be an array of ids", what);
      for (const auto& id : *nr) {
        HR_ARG_CHECK(id.is_string(), "{}: field \"not_run\" must be an array of ids", what);
        r.not_run.push_back(id.get<std::string>());
      }
    }
  }
  // Totals are recounted rather than trusted; stored ones that disagree with the
  // recount mean the file was edited or is corrupt.
  compute_totals(r);
  if (auto t = j.find("totals"); t != j.end() && t->is_object()) {
    // Every count the writer writes, recounted.
    const nlohmann::json recount = totals_to_json(r.totals);
    for (const auto& [key, n] : recount.items()) {
      auto v = t->find(key);
      if (v == t->end()) continue;
      HR_ARG_CHECK(v->is_number_integer() && v->get<int64_t>() == n.get<int64_t>(),
                   "{}: inconsistent: totals.{} is {} but the file holds {}", what, key, v->dump(), n.dump());
    }
  }
  return r;
}

void save_results(const Results& r, const std::string& path) {
  write_output(path, results_to_json(r).dump(2) + "\n");
}

nlohmann::json parse_json_strict(const std::string& text, const std::string& where) {
  // Depth first, by a scan that does not recurse: nothing deeper reaches the parser.
  {
    size_t depth = 0, max_depth = 0;
    bool in_string = false, escaped = false;
    for (const char ch : text) {
      if (in_string) {
        if (escaped) escaped = false;
        else if (ch == '\\') escaped = true;
        else if (ch == '"') in_string = false;
        continue;
      }
      if (ch == '"') in_string = true;
      else if (ch == '{' || ch == '[') max_depth = std::max(max_depth, ++depth);
      else if ((ch == '}' || ch == ']') && depth > 0) --depth;
      if (max_depth > kMaxJsonDepth)
        throw InvalidArgument(fmt::format("{}: nested more than {} levels deep; headroom reads no deeper", where,
                                          kMaxJsonDepth));
    }
  }
  // A key given twice in one object is refused: which one counts would be a guess.
  std::vector<std::set<std::string>> keys;
  auto cb = [&](int depth, nlohmann::json::parse_event_t ev, nlohmann::json& parsed) {
    using E = nlohmann::json::parse_event_t;
    if (ev == E::object_start) keys.emplace_back();
    else if (ev == E::object_end && !keys.empty()) keys.pop_back();
    else if (ev == E::key && !keys.empty()) {
      const std::string k = parsed.get<std::string>();
      if (!keys.back().insert(k).second)
        throw InvalidArgument(fmt::format("{}: key \"{}\" appears twice in one object (at depth {})", where, k, depth));
    }
    return true;
  };
  try {
    return nlohmann::json::parse(text, cb);  // strict: trailing text after the value is an error
  } catch (const nlohmann::json::exception& e) {
    // nlohmann's text without its "[json.exception.parse_error.101] " tag.
    std::string why = e.what();
    if (why.rfind("[json.exception", 0) == 0 && why.find("] ") != std::string::npos) why = why.substr(why.find("] ") + 2);
    throw InvalidArgument(fmt::format("{}: not valid JSON: {}", where, why));
  }
}

nlohmann::json read_json_file(const std::string& path, const std::string& what, size_t max_bytes) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  // The system's reason (a link loop, a permission, a component that is a file),
  // "no such file" only when that is what it is.
  HR_ARG_CHECK(!ec || ec == std::errc::no_such_file_or_directory, "cannot open the {} {}: {}", what, path,
               ec.message());
  HR_ARG_CHECK(fs::exists(st), "cannot open the {} {}: no such file", what, path);
  HR_ARG_CHECK(!fs::is_directory(st), "cannot read the {} {}: it is a directory, not a file", what, path);
  HR_ARG_CHECK(fs::is_regular_file(st), "cannot read the {} {}: not a regular file", what, path);
  const uintmax_t size = fs::file_size(path, ec);
  HR_ARG_CHECK(!ec, "cannot read the {} {}: {}", what, path, ec.message());
  HR_ARG_CHECK(size <= max_bytes, "the {} {} is {} bytes; headroom reads at most {} bytes", what, path, size,
               max_bytes);
  std::ifstream in(path, std::ios::binary);
  HR_ARG_CHECK(in.good(), "cannot open the {} {}: {}", what, path, std::strerror(errno));
  std::string text(static_cast<size_t>(size), '\0');
  in.read(text.data(), static_cast<std::streamsize>(size));
  HR_ARG_CHECK(static_cast<uintmax_t>(in.gcount()) == size, "cannot read the {} {}: read {} of {} bytes", what,
               path, in.gcount(), size);
  return parse_json_strict(text, path);
}

void refuse_output_over_input(const std::string& output, const std::string& output_role,
                              const std::vector<std::pair<std::string, std::string>>& inputs) {
  struct stat out_st {};
  if (output.empty() || ::stat(output.c_str(), &out_st) != 0) return;  // not there yet: nothing to overwrite
  for (const auto& [path, role] : inputs) {
    struct stat in_st {};
    if (path.empty() || ::stat(path.c_str(), &in_st) != 0) continue;
    if (in_st.st_dev == out_st.st_dev && in_st.st_ino == out_st.st_ino)
      throw InvalidArgument(fmt::format("{} {} is the same file as {} {}: refusing to overwrite an input; write the "
                                        "output elsewhere",
                                        output_role, output, role, path));
  }
}

bool recomputed_verdict(const Measurement& m) {
  if (is_error_measurement(m)) return false;
  if (!std::isfinite(m.error)) return false;
  if (!m.negative_control) return m.error <= m.tolerance;
  if (!(m.error > m.tolerance)) return false;
  if (m.control == "subtle")
    return m.error <= tol::kSubtleControlMaxPower * (m.tolerance > 0 ? m.tolerance : 1.0);
  return true;
}

Results load_results(const std::string& path) {
  return results_from_json(read_json_file(path, "results file", kMaxResultsBytes), path);
}

}  // namespace hr
