// Check power (docs/catalogue.md POWER), per check, not per property: every check a
// registered property makes (an assertion, "ID: title", over every dtype, model and
// configuration) has a subtle negative control aimed at it (control_of) whose error
// lies within 100x of the bound, and catches it; a broken variant that blows up to
// NaN or inf is never counted as caught. And every control is a fault switch in the
// code path: run with the switches disarmed (harness/faults.hpp), no control may be
// caught, since a control that "catches" a correct run is fake. A new check without
// a subtle control, or a control whose fault is arithmetic of the property, fails here.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <string>

#include "harness/check.hpp"
#include "harness/dist/launch.hpp"
#include "harness/faults.hpp"
#include "harness/registry.hpp"
#include "harness/results/results.hpp"
#include "harness/tolerances.hpp"
#include "suites/common/property_check.hpp"
#include "suites/common/test_support.hpp"

namespace {

TEST(Power, NonFiniteErrorIsNotACatch) {
  for (double bad : {NAN, INFINITY, -INFINITY}) {
    const hr::Measurement m = hr::make_negative_control("GA-2", "broken", bad, 1e-5);
    EXPECT_FALSE(m.passed) << bad;
    EXPECT_FALSE(m.power.has_value());
    EXPECT_TRUE(m.details.contains("not_caught"));
  }
  const hr::Measurement ok = hr::make_negative_control("GA-2", "broken", 3e-4, 1e-5);
  EXPECT_TRUE(ok.passed);
  ASSERT_TRUE(ok.power.has_value());
  EXPECT_DOUBLE_EQ(*ok.power, 30.0);
  EXPECT_EQ(ok.control, "gross");
}

TEST(Power, SubtleControlMustLieWithinItsRatioOfTheBound) {
  const double bound = 1e-5;
  const hr::Measurement within = hr::make_subtle_control("GA-1", "fp16 buffer", 40 * bound, bound);
  EXPECT_TRUE(within.passed);
  EXPECT_EQ(within.control, "subtle");
  const hr::Measurement below = hr::make_subtle_control("GA-1", "fp16 buffer", 0.5 * bound, bound);
  EXPECT_FALSE(below.passed);  // not caught
  const hr::Measurement gross =
      hr::make_subtle_control("GA-1", "fp16 buffer", 2 * hr::tol::kSubtleControlMaxPower * bound, bound);
  EXPECT_FALSE(gross.passed);  // caught, but too large to show anything about the bound
  EXPECT_TRUE(gross.details.contains("not_caught"));
  EXPECT_FALSE(hr::make_subtle_control("GA-1", "nan", NAN, bound).passed);
  // A bitwise check (bound 0) counts mismatching elements: power is in elements.
  const hr::Measurement one = hr::make_subtle_control("DET-1", "one element off by an ulp", 1.0, 0.0);
  EXPECT_TRUE(one.passed);
  EXPECT_DOUBLE_EQ(*one.power, 1.0);
  EXPECT_FALSE(hr::make_subtle_control("DET-1", "every element", 4096.0, 0.0).passed);
}

TEST(Power, ControlAndPowerSurviveResultsJson) {
  hr::Measurement m = hr::make_subtle_control("GA-1", "fp16 buffer", 2e-4, 1e-5);
  m.backend = "cpu";
  const hr::Measurement back = hr::measurement_from_json(nlohmann::json(m));
  EXPECT_EQ(back.control, "subtle");
  ASSERT_TRUE(back.power.has_value());
  EXPECT_DOUBLE_EQ(*back.power, 20.0);
  nlohmann::json old = nlohmann::json(hr::make_negative_control("GA-2", "no division", 1.0, 1e-5));
  old.erase("control");  // a results file written before the field existed
  EXPECT_EQ(hr::measurement_from_json(old).control, "gross");
  nlohmann::json wrong = nlohmann::json(m);
  wrong["control"] = "medium";
  EXPECT_THROW(hr::measurement_from_json(wrong), hr::InvalidArgument);
}

// Properties that measure nothing on the CPU, and why (they run on a GPU only).
const std::map<std::string, std::string> kGpuOnly = {
    {"MEM-3", "compares the tracker with the CUDA pool's own high-water mark"}};

// Checks whose subtle control is still to come, each with the reason. The test
// fails when one of them gains a caught subtle control (take it off the list) and
// when any other check lacks one.
const std::map<std::string, std::string> kSubtleControlPending = {
#include "suites/correctness/power_pending.inc"
};

// Controls whose broken variant is not (yet) a switch in the code path: a
// configuration the property chooses (another norm, another schedule, a test-side
// construction), so they stay caught with the switches disarmed. The test fails
// when one of them is no longer caught disarmed (take it off the list) and when any
// other control is.
const std::map<std::string, std::string> kNotASwitch = {
#include "suites/correctness/power_not_a_switch.inc"
};

struct SpecRuns {
  bool skipped = false;
  std::string skip_reason;
  std::vector<hr::Measurement> armed, disarmed;
};

SpecRuns run_spec(const hr::PropertySpec& spec) {
  SpecRuns r;
  hr::Device& dev = hr::test::cpu_device();
  try {
    hr::RunContext ctx{dev, hr::Preset::quick, 1234, {}};
    r.armed = spec.run(ctx);
  } catch (const hr::Skipped& e) {
    r.skipped = true;
    r.skip_reason = e.what();
    return r;
  }
  hr::faults::Disarmed off;
  EXPECT_FALSE(hr::faults::armed());
  hr::RunContext ctx{dev, hr::Preset::quick, 1234, {}};
  r.disarmed = spec.run(ctx);
  return r;
}

std::string control_key(const hr::Measurement& m) { return hr::check_name(m.id, m.title); }

// Every registered property, armed and disarmed, at the quick preset on the CPU:
// one test, since a control may be aimed at another property's check (CK-2's at
// CK-1's, GA-2's at GA-1's).
TEST(Power, EveryCheckHasACaughtSubtleControlAndEveryControlIsASwitch) {
  std::vector<hr::Measurement> armed, disarmed;
  for (const hr::PropertySpec& spec : hr::property_registry()) {
    SCOPED_TRACE(spec.id);
    SpecRuns r = run_spec(spec);
    if (r.skipped) {
      // A stated skip: the data-parallel entries where MPI or mpirun is absent, the
      // GPU-only ones on the CPU. Nothing else may skip here.
      const bool dp_absent = spec.id == "DP-1" && !hr::dist::dp_unavailable_reason().empty();
      EXPECT_TRUE(dp_absent || kGpuOnly.count(spec.id)) << spec.id << " skipped on the CPU: " << r.skip_reason;
      continue;
    }
    EXPECT_FALSE(r.armed.empty()) << spec.id << " measured nothing on the CPU and did not say why (throw Skipped)";
    EXPECT_EQ(r.disarmed.size(), r.armed.size()) << spec.id << ": the disarmed run measured something else";
    armed.insert(armed.end(), r.armed.begin(), r.armed.end());
    disarmed.insert(disarmed.end(), r.disarmed.begin(), r.disarmed.end());
  }

  // Checks, and the subtle controls caught for each.
  std::map<std::string, int> caught_subtle;  // check name -> caught subtle controls aimed at it
  for (const hr::Measurement& m : armed)
    if (!m.negative_control) caught_subtle.emplace(hr::check_name(m.id, m.title), 0);
  for (const hr::Measurement& m : armed) {
    if (!m.negative_control) continue;
    SCOPED_TRACE(hr::test::describe(m));
    EXPECT_TRUE(hr::test::passed(m));
    if (m.control_of.empty()) {
      ADD_FAILURE() << "a control that names no check it must trip";
      continue;
    }
    EXPECT_TRUE(caught_subtle.count(m.control_of)) << "control_of names no check of this run: " << m.control_of;
    if (m.control != "subtle" || !m.passed) continue;
    ASSERT_TRUE(m.power.has_value());
    // A bound of zero (bitwise, or an exact count) makes the power the count the
    // fault changed: one element, or one micro-batch, is the subtlest catch there is.
    if (m.tolerance == 0)
      EXPECT_GE(*m.power, 1.0);
    else
      EXPECT_GT(*m.power, 1.0);
    EXPECT_LE(*m.power, hr::tol::kSubtleControlMaxPower);
    if (caught_subtle.count(m.control_of)) ++caught_subtle[m.control_of];
  }
  for (const auto& [check, n] : caught_subtle) {
    if (kSubtleControlPending.count(check)) {
      EXPECT_EQ(n, 0) << check << " now has a subtle control: take it off power_pending.inc";
      continue;
    }
    EXPECT_GT(n, 0) << "no caught subtle control aimed at " << check;
  }
  for (const auto& [check, why] : kSubtleControlPending)
    EXPECT_TRUE(caught_subtle.count(check)) << "power_pending.inc names no check of this run: " << check;

  // Disarmed: no control caught.
  std::set<std::string> still_caught;
  for (const hr::Measurement& m : disarmed) {
    if (!m.negative_control) continue;
    if (m.passed) still_caught.insert(control_key(m));
    if (!kNotASwitch.count(control_key(m)))
      EXPECT_FALSE(m.passed) << "caught with every fault switch off (its fault is not in the code path): {"
                             << control_key(m) << "} " << hr::test::describe(m);
  }
  for (const auto& [control, why] : kNotASwitch)
    EXPECT_TRUE(still_caught.count(control))
        << control << " is not caught with the switches off (or not run): take it off power_not_a_switch.inc";
}

TEST(Power, EveryListedExceptionSaysWhy) {
  for (const auto* list : {&kSubtleControlPending, &kNotASwitch})
    for (const auto& [name, why] : *list) {
      EXPECT_NE(name.find(": "), std::string::npos) << name << ": not a check name (ID: title)";
      EXPECT_FALSE(why.empty()) << name << ": an exception needs its reason";
    }
}

}  // namespace
