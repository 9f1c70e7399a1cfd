// Fault injection: the Nth allocation of one training step fails, for every N the
// step makes. Each failure is an OutOfMemory (never another exception, never a
// crash), leaves the accounting where it was before the step (nothing leaked), and
// the device stays usable: the same step afterwards gives the same loss.
#include <gtest/gtest.h>

#include <filesystem>

#include "harness/check.hpp"
#include "harness/device.hpp"
#include "harness/dump/dump.hpp"
#include "suites/common/step_support.hpp"
#include "suites/common/test_support.hpp"

namespace {

hr::StepConfig fault_config(hr::ModelKind model) {
  hr::StepConfig cfg = model == hr::ModelKind::mlp ? hr::test::tiny_mlp_config(hr::DType::f32, hr::NormKind::layernorm)
                                                   : hr::test::tiny_transformer_config(hr::DType::f32);
  cfg.mlp.dropout = 0.1f;  // the masks' allocations too
  cfg.transformer.dropout = 0.1f;
  return cfg;
}

class FaultInjection : public testing::TestWithParam<hr::ModelKind> {};

TEST_P(FaultInjection, EveryAllocationOfAStepCanFailWithoutALeak) {
  auto dev = hr::make_cpu_device();
  const hr::StepConfig cfg = fault_config(GetParam());
  // A folder of this test's own: the two models' cases run at once under ctest -j.
  const hr::test::TempDir tmp;
  const std::filesystem::path dir = tmp.path / "dump";

  const auto before = dev->memory().snapshot();
  const hr::DumpResult reference = hr::dump_model(*dev, cfg, dir.string(), 7);
  const uint64_t allocations = dev->memory().snapshot().allocations - before.allocations;
  ASSERT_GT(allocations, 10u);
  EXPECT_EQ(dev->memory().snapshot().live_allocations, before.live_allocations);

  uint64_t failed = 0;
  for (uint64_t n = 1; n <= allocations; ++n) {
    dev->memory().fail_nth_allocation(n);
    try {
      hr::dump_model(*dev, cfg, dir.string(), 7);
      ADD_FAILURE() << "allocation " << n << " of " << allocations << " was set to fail and the step succeeded";
    } catch (const hr::OutOfMemory&) {
      ++failed;
    } catch (const std::exception& e) {
      ADD_FAILURE() << "allocation " << n << ": not an OutOfMemory: " << e.what();
    }
    dev->memory().fail_nth_allocation(0);
    const auto after = dev->memory().snapshot();
    ASSERT_EQ(after.live_allocations, before.live_allocations) << "allocation " << n << " leaked";
    ASSERT_EQ(after.total_current_bytes, before.total_current_bytes) << "allocation " << n << " leaked";
  }
  EXPECT_EQ(failed, allocations);
  std::cout << "fault injection (" << hr::model_kind_name(cfg.model) << "): " << failed << " of " << allocations << " allocations failed in turn, none leaked\n";
  EXPECT_EQ(hr::dump_model(*dev, cfg, dir.string(), 7).loss, reference.loss);
}

INSTANTIATE_TEST_SUITE_P(Models, FaultInjection, testing::Values(hr::ModelKind::mlp, hr::ModelKind::transformer),
                         [](const testing::TestParamInfo<hr::ModelKind>& i) { return hr::model_kind_name(i.param); });

}  // namespace
