// GoogleTest support for property functions (harness/registry.hpp): assert on a
// Measurement with a failure message that says which property, configuration,
// error and bound, so a red test reads like a line of the report.
#pragma once

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "harness/registry.hpp"

namespace hr::test {

inline std::string describe(const Measurement& m) {
  return m.id + " [" + m.backend + " " + m.dtype + " " + m.model + " " + m.config.dump() + "] " + m.title + ": " +
         m.metric + " = " + json_number(m.error).dump() + (m.negative_control ? " must exceed " : " bound ") +
         json_number(m.tolerance).dump() + (m.negative_control ? " (negative control)" : "");
}

// EXPECT_TRUE(passed(m)): a correct variant within its bound, or a negative
// control caught. A measurement always carries its catalogue ID.
inline testing::AssertionResult passed(const Measurement& m) {
  if (m.id.empty()) return testing::AssertionFailure() << "measurement without an ID: " << describe(m);
  if (m.passed) return testing::AssertionSuccess() << describe(m);
  return testing::AssertionFailure() << (m.negative_control ? "NOT CAUGHT: " : "FAILED: ") << describe(m);
}

// Every measurement passed, there are `expected` of them (a property that quietly
// returns nothing must not pass), and `negative_controls` of them are negative
// controls.
inline void expect_all_passed(const std::vector<Measurement>& ms, size_t expected, size_t negative_controls) {
  EXPECT_EQ(ms.size(), expected);
  size_t neg = 0;
  for (const Measurement& m : ms) {
    EXPECT_TRUE(passed(m));
    neg += m.negative_control ? 1 : 0;
  }
  EXPECT_EQ(neg, negative_controls);
}

// Runs the registered property `id` on `dev` (quick preset), as `headroom run` does.
inline std::vector<Measurement> run_property(const std::string& id, Device& dev, Preset preset = Preset::quick) {
  for (const auto& spec : property_registry()) {
    if (spec.id != id) continue;
    RunContext ctx{dev, preset, 1234, {}};
    return spec.run(ctx);
  }
  ADD_FAILURE() << id << " is not registered";
  return {};
}

}  // namespace hr::test
