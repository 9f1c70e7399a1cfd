// OPS-1 / DET-1 as `headroom run` collects them on a device: every op case of the
// run-time subset within its float64 bound in every dtype, bitwise repeatable, a
// whole training step of each model bitwise repeatable, and each property's gross
// and subtle negative controls caught (the subtle ones within 100x of the bound).
#include <gtest/gtest.h>

#include <map>
#include <set>

#include "harness/tolerances.hpp"
#include "suites/common/property_check.hpp"
#include "suites/common/test_support.hpp"

namespace {

class OpsConformanceProperty : public testing::TestWithParam<hr::BackendKind> {};

TEST_P(OpsConformanceProperty, EveryOpWithinItsBoundAndRepeatable) {
  HR_TEST_DEVICE(dev, GetParam());
  const auto ms = hr::test::run_property("OPS-1", dev);
  // Per float dtype: 9 op cases (8 ops: the product twice, the linear layer, ...) x
  // (OPS-1 + DET-1); per op a gross and a subtle control of each of its two checks
  // (OpFault); the matrix product's two input faults; per model a DET-1 step check
  // with its gross and subtle controls.
  hr::test::expect_all_passed(ms, 3u * (9u * 2u + 8u * 4u + 2u + 2u * 3u), 3u * (8u * 4u + 2u + 2u * 2u));
  std::set<std::string> dtypes, ops;
  std::map<std::string, int> subtle, step_checks;  // "id dtype" -> count
  std::map<std::string, int> subtle_of;             // "check dtype" -> subtle controls aimed at it
  for (const auto& m : ms) {
    EXPECT_EQ(m.backend, hr::backend_name(dev.kind()));
    dtypes.insert(m.dtype);
    ops.insert(m.model);
    if (m.id == "OPS-1" && !m.negative_control) EXPECT_GT(m.error, 0.0) << hr::test::describe(m);
    if (m.control == "subtle") {
      ++subtle[m.id + " " + m.dtype];
      ++subtle_of[m.control_of + " " + m.dtype];
      ASSERT_TRUE(m.power.has_value()) << hr::test::describe(m);
      EXPECT_LE(*m.power, hr::tol::kSubtleControlMaxPower) << hr::test::describe(m);
    }
    if (m.id == "DET-1" && !m.negative_control && (m.model == "mlp" || m.model == "transformer")) {
      ++step_checks[m.model + " " + m.dtype];
      EXPECT_GT(m.details.value("elements", 0), 1000) << hr::test::describe(m);
    }
  }
  EXPECT_EQ(dtypes.size(), 3u);
  EXPECT_GE(ops.size(), 10u);  // 8 ops, the two models
  for (const char* dt : {"fp32", "fp16", "bf16"}) {
    EXPECT_EQ(subtle[std::string("OPS-1 ") + dt], 9) << dt;
    EXPECT_EQ(subtle[std::string("DET-1 ") + dt], 10) << dt;
    for (const auto& m : ms)
      if (!m.negative_control && m.dtype == dt)
        EXPECT_GE(subtle_of[hr::check_name(m.id, m.title) + " " + dt], 1) << hr::test::describe(m);
    EXPECT_EQ(step_checks[std::string("mlp ") + dt], 1) << dt;
    EXPECT_EQ(step_checks[std::string("transformer ") + dt], 1) << dt;
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, OpsConformanceProperty,
                         testing::Values(hr::BackendKind::cpu, hr::BackendKind::cuda), hr::test::backend_param_name);

}  // namespace
