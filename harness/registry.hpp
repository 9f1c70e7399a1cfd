// What a run produces, and how properties and sweeps are registered.
//
// A property (docs/catalogue.md, e.g. GA-1) is a function that runs on a Device and
// returns Measurements: the measured error, the tolerance, pass/fail and the
// numbers behind it. GoogleTest cases assert on the same functions; `headroom
// run` collects them into results.json and the report. A sweep (BM-* and curves)
// returns SweepPoints: a configuration, its time statistics and bytes per
// consumer, or the reason it did not run.
//
// Registration is static: HR_REGISTER_PROPERTY / HR_REGISTER_SWEEP in the .cpp
// that defines the function; headroom_core is a shared library, so none is lost.
#pragma once

#include <nlohmann/json.hpp>

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "harness/device.hpp"
#include "harness/json_number.hpp"
#include "harness/memory.hpp"
#include "harness/timing.hpp"

namespace hr {

// One checked property on one configuration.
struct Measurement {
  std::string id;       // catalogue ID: "GA-1"
  std::string title;    // "accumulated gradient equals the full-batch gradient"
  std::string backend;  // "cpu" | "cuda"
  std::string dtype;    // "fp32" | "fp16" | "bf16"
  std::string model;    // "mlp" | "transformer" | "op:<name>" | ""
  nlohmann::json config = nlohmann::json::object();  // the varying knobs (micro_batch, ...)
  std::string metric;   // what `error` is: "rel_l2", "nmse", "bitwise_mismatches", "ratio", ...
  double error = 0;     // measured value (may be non-finite: encoded explicitly in JSON)
  double tolerance = 0; // bound on `error` for a pass (for negative controls: the bound
                        // the broken variant must EXCEED to count as caught)
  bool negative_control = false;  // true: the broken variant is run and must be caught
  // For a negative control, how large its injected fault is (docs/catalogue.md POWER):
  // "gross": the documented failure mode at full size (no division by K at all);
  // "subtle": a fault whose error lies within tol::kSubtleControlMaxPower times the
  // bound (divide by K+1, a token count off by one, a 16-bit accumulation buffer),
  // which shows the check can see an error near its bound. Empty for a check.
  std::string control;
  // For a caught negative control: error / tolerance, the injected error in units of
  // the bound. Counts (bitwise comparisons, exact counts) have the bound 0.5
  // (tol::kBitwiseMismatches: "fewer than one"), so one element off is a power of 2.
  // Only real-valued exact checks keep a bound of 0 (DP-2's byte ratio, a ZeRO share
  // that divides evenly); their power is the error itself, in the metric's units.
  // The smallest power over a check's caught controls is the smallest error that
  // check was shown to see (the report's power column).
  std::optional<double> power;
  bool passed = false;  // correct variant: error <= tolerance; negative control: caught
  // The stable key of this measurement: the same at every seed and in every run of
  // the same preset and backend, so that a comparison finds the baseline's check in
  // another run (results.json "check"). The runner fills it with default_check_key
  // when a property leaves it empty; no seed-dependent number may enter it (nor the
  // title or config it is made of).
  std::string check;
  // For a negative control: the check it must trip, as check_name(id, title) of that
  // check ("GA-1: accumulated gradient equals the full-batch gradient"). A check is an
  // assertion of a property, the same over dtypes, models and configurations; the
  // power test requires every check to have a caught subtle control aimed at it.
  std::string control_of;
  std::string tolerance_reason;   // where the bound comes from
  nlohmann::json details = nlohmann::json::object();  // the numbers behind it
};

// "ID | backend dtype model | config | [gross|subtle control: ]title": the key a
// measurement gets when its property names none (see Measurement::check).
std::string default_check_key(const Measurement& m);

// The name of a check: "<ID>: <title of its measurements>" (Measurement::control_of).
std::string check_name(const std::string& id, const std::string& title);

// Measurement for a correct variant: passes when error <= tolerance (NaN never passes).
Measurement make_check(std::string id, std::string title, double error, double tolerance);
// Measurement for a negative control: passes ("caught") when error > tolerance and
// is finite. A NaN or inf is not a catch: a broken variant that blows up says nothing
// about whether the check can see an error of realistic size, so it fails.
// `of` names the check it must trip (check_name).
Measurement make_negative_control(std::string id, std::string title, double error, double tolerance,
                                  std::string of = {});
// The same for a subtle control: caught when finite, above the tolerance, and within
// tol::kSubtleControlMaxPower times it; a larger error is not a subtle control and
// fails, so the suite cannot drift into controls that only show gross faults.
Measurement make_subtle_control(std::string id, std::string title, double error, double tolerance,
                                 std::string of = {});

// One configuration of a sweep.
struct SweepPoint {
  std::string sweep;  // catalogue ID: "BM-MB", "CK-3", "PK-4", "TRADE", ...
  std::string backend, dtype, model;
  nlohmann::json config = nlohmann::json::object();  // e.g. {"micro_batch": 4, "accum_steps": 8}
  std::string status = "ok";  // "ok" | "out_of_memory" | "skipped" | "error"
  std::string reason;         // why it did not run, when status != ok
  std::optional<TimeStats> time;
  MemorySnapshot memory;      // peaks per consumer over the measured region
  nlohmann::json metrics = nlohmann::json::object();  // tokens_per_s, flops, fitted exponents...
};

enum class Preset { quick, full };
const char* preset_name(Preset p);
Preset parse_preset(const std::string& s);

// What a property or sweep function is given.
struct RunContext {
  Device& device;
  Preset preset = Preset::quick;
  uint64_t seed = 1234;
  // Called with a short note while long work progresses (may be empty).
  std::function<void(const std::string&)> progress;
};

struct PropertySpec {
  std::string id;     // "GA-1" (a spec may emit measurements of several IDs, e.g. GA-1..GA-2)
  std::string title;
  double expected_seconds_quick = 1.0;  // for progress estimates on a 2-core CPU
  std::function<std::vector<Measurement>(RunContext&)> run;
  // What it needs beyond a backend, or it is recorded skipped with the reason:
  // "" (nothing), "mpirun" (the data-parallel worker), "a GPU". `headroom list` shows it.
  std::string needs;
};

struct SweepSpec {
  std::string id;     // "BM-MB"
  std::string title;
  double expected_seconds_quick = 1.0;
  std::function<std::vector<SweepPoint>(RunContext&)> run;
  // Optional: measures one point of this sweep again from the point as recorded
  // (its sweep, dtype, model and config), on ctx.device. `headroom validate` calls
  // it to confirm a suspected step-time regression before calling it one. Returns
  // nullopt when the configuration is not one this sweep would run.
  std::function<std::optional<SweepPoint>(RunContext&, const SweepPoint&)> remeasure;
  std::string needs;  // as PropertySpec::needs
};

std::vector<PropertySpec>& property_registry();
std::vector<SweepSpec>& sweep_registry();

struct Registrar {
  explicit Registrar(PropertySpec s);
  explicit Registrar(SweepSpec s);
};

void to_json(nlohmann::json& j, const Measurement& m);
void to_json(nlohmann::json& j, const SweepPoint& p);
void to_json(nlohmann::json& j, const MemorySnapshot& m);

// json_number / json_to_double: harness/json_number.hpp (included above).

}  // namespace hr

#define HR_REGISTRY_CONCAT2(a, b) a##b
#define HR_REGISTRY_CONCAT(a, b) HR_REGISTRY_CONCAT2(a, b)
// HR_REGISTER_PROPERTY(hr::PropertySpec{...}); at namespace scope.
#define HR_REGISTER_PROPERTY(...) \
  static ::hr::Registrar HR_REGISTRY_CONCAT(hr_property_registrar_, __LINE__)(__VA_ARGS__)
#define HR_REGISTER_SWEEP(...) \
  static ::hr::Registrar HR_REGISTRY_CONCAT(hr_sweep_registrar_, __LINE__)(__VA_ARGS__)
