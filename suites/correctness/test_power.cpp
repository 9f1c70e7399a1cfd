// Check power (PROPERTIES.md POWER): every registered property carries, beside its
// gross negative control, a subtle one whose error lies within 100x of its bound,
// and catches it; a broken variant that blows up to NaN or inf is never counted
// as caught. A new property without a subtle control fails here.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <set>
#include <string>

#include "harness/check.hpp"
#include "harness/dist/launch.hpp"
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

// Properties whose subtle control is still to come. The test fails when one of
// them gains a subtle control (shrink the list) and when any other lacks one.
// - PK-3: its check counts packed rows at most half full beyond the one first fit
//   allows (bound: none); the pad fractions beside it are measurements. A packer
//   fault that leaves between 1 and 100 such rows at every seed is still to be found
//   (next fit in arrival order, the gross control, leaves hundreds).
// - PK-2: both faults it names are gross by nature. Without the boundary mask a
//   sequence attends to whole other sequences; with positions running on, a
//   sequence's tokens read, and send their gradient to, other rows of the learned
//   position table, so that table's gradient differs in full (measured >= 110x
//   bf16's bound, >= 1e5x fp32's). PK-1's own subtle control (the real-token count
//   off) shows the same check seeing errors near its bound.
const std::set<std::string> kSubtleControlPending = {"PK-2", "PK-3"};

TEST(Power, EveryRegisteredPropertyCatchesASubtleControl) {
  HR_TEST_DEVICE(dev, hr::BackendKind::cpu);
  ASSERT_FALSE(hr::property_registry().empty());
  for (const hr::PropertySpec& spec : hr::property_registry()) {
    SCOPED_TRACE(spec.id);
    hr::RunContext ctx{dev, hr::Preset::quick, 1234, {}};
    std::vector<hr::Measurement> ms;
    try {
      ms = spec.run(ctx);
    } catch (const hr::Skipped& e) {
      // A stated skip: the data-parallel entries where MPI or mpirun is absent, the
      // GPU-only ones on the CPU. Nothing else may skip here.
      const bool dp_absent = spec.id == "DP-1" && !hr::dist::dp_unavailable_reason().empty();
      EXPECT_TRUE(dp_absent || kGpuOnly.count(spec.id)) << spec.id << " skipped on the CPU: " << e.what();
      continue;
    }
    EXPECT_FALSE(ms.empty()) << spec.id << " measured nothing on the CPU and did not say why (throw Skipped)";
    if (ms.empty()) continue;
    std::set<std::string> ids_with_subtle, ids;
    for (const hr::Measurement& m : ms) {
      ids.insert(m.id);
      if (m.control != "subtle") continue;
      EXPECT_TRUE(hr::test::passed(m));
      ASSERT_TRUE(!m.passed || m.power.has_value()) << hr::test::describe(m);
      if (m.passed) {
        // A bound of zero (bitwise, or an exact count) makes the power the count the
        // fault changed: one element, or one micro-batch, is the subtlest catch there is.
        if (m.tolerance == 0)
          EXPECT_GE(*m.power, 1.0) << hr::test::describe(m);
        else
          EXPECT_GT(*m.power, 1.0) << hr::test::describe(m);
        EXPECT_LE(*m.power, hr::tol::kSubtleControlMaxPower) << hr::test::describe(m);
        ids_with_subtle.insert(m.id);
      }
    }
    // A spec may emit several IDs (OPS-1 and DET-1): each needs its own.
    for (const std::string& id : ids) {
      if (kSubtleControlPending.count(id)) {
        EXPECT_FALSE(ids_with_subtle.count(id)) << id << " now has a subtle control: take it off the pending list";
        continue;
      }
      EXPECT_TRUE(ids_with_subtle.count(id)) << id << " (registered as " << spec.id
                                             << ") has no caught subtle negative control";
    }
  }
}

}  // namespace
