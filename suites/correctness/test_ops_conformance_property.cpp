// OPS-1 / DET-1 as `headroom run` collects them on a device: every op case of the
// run-time subset within its float64 bound in every dtype, bitwise repeatable, and
// the wrong-transpose negative control caught.
#include <gtest/gtest.h>

#include <set>

#include "suites/common/property_check.hpp"
#include "suites/common/test_support.hpp"

namespace {

class OpsConformanceProperty : public testing::TestWithParam<hr::BackendKind> {};

TEST_P(OpsConformanceProperty, EveryOpWithinItsBoundAndRepeatable) {
  HR_TEST_DEVICE(dev, GetParam());
  const auto ms = hr::test::run_property("OPS-1", dev);
  // 8 op cases x (OPS-1 + DET-1) + 1 negative control, per float dtype.
  hr::test::expect_all_passed(ms, 3u * (8u * 2u + 1u), 3u);
  std::set<std::string> dtypes, ops;
  for (const auto& m : ms) {
    EXPECT_EQ(m.backend, hr::backend_name(dev.kind()));
    dtypes.insert(m.dtype);
    ops.insert(m.model);
    if (m.id == "OPS-1" && !m.negative_control) EXPECT_GT(m.error, 0.0) << hr::test::describe(m);
  }
  EXPECT_EQ(dtypes.size(), 3u);
  EXPECT_GE(ops.size(), 7u);
}

INSTANTIATE_TEST_SUITE_P(Backends, OpsConformanceProperty,
                         testing::Values(hr::BackendKind::cpu, hr::BackendKind::cuda), hr::test::backend_param_name);

}  // namespace
