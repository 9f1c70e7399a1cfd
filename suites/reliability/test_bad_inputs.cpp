// Bad inputs are refused with a message that names the problem, and recovery
// after an out-of-memory leaves the device usable with nothing leaked.
#include <gtest/gtest.h>

#include "harness/check.hpp"
#include "harness/tensor.hpp"
#include "suites/common/test_support.hpp"

namespace {

TEST(BadInput, UnknownDtypeNamesTheAcceptedValues) {
  try {
    hr::parse_dtype("fp8");
    FAIL() << "fp8 accepted";
  } catch (const hr::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("fp8"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("bf16"), std::string::npos);
  }
}

TEST(BadInput, NegativeShapeIsRefused) {
  auto dev = hr::make_cpu_device();
  EXPECT_THROW(hr::Tensor::empty(*dev, {3, -1}, hr::DType::f32, hr::Consumer::workspace), hr::InvalidArgument);
  EXPECT_EQ(dev->memory().snapshot().live_allocations, 0u);
}

TEST(BadInput, BadReshapeAndSliceThrow) {
  auto dev = hr::make_cpu_device();
  auto t = hr::Tensor::empty(*dev, {4, 6}, hr::DType::f32, hr::Consumer::workspace);
  EXPECT_THROW(t.reshape({5, 5}), hr::Error);
  EXPECT_THROW(t.reshape({-1, -1}), hr::Error);
  EXPECT_THROW(t.slice(3, 5), hr::Error);
  EXPECT_EQ(t.reshape({-1, 3}).dim(0), 8);
}

class Recovery : public testing::TestWithParam<hr::BackendKind> {};

TEST_P(Recovery, DeviceIsUsableAfterOutOfMemory) {
  HR_TEST_DEVICE(dev, GetParam());
  const auto before = dev.memory().snapshot();
  dev.memory().set_budget(before.total_current_bytes + (1 << 20));
  EXPECT_THROW(hr::Tensor::empty(dev, {1 << 20}, hr::DType::f32, hr::Consumer::activations), hr::OutOfMemory);
  dev.memory().set_budget(std::nullopt);
  auto v = hr::test::random_nonzero(1000, 5);
  auto t = hr::Tensor::from_host(dev, v, {1000}, hr::DType::f32, hr::Consumer::activations);
  EXPECT_EQ(t.to_host_f32(), v);
}

TEST(RecoveryGpu, cuda_RealOutOfMemoryIsRecoverable) {
  HR_TEST_DEVICE(dev, hr::BackendKind::cuda);
  const size_t too_much = dev.record().memory_bytes * 2;
  EXPECT_THROW(hr::Tensor::empty(dev, {static_cast<int64_t>(too_much / 4)}, hr::DType::f32,
                                 hr::Consumer::activations),
               hr::OutOfMemory);
  auto t = hr::Tensor::zeros(dev, {1024}, hr::DType::f32, hr::Consumer::activations);
  EXPECT_EQ(t.to_host_f32()[1023], 0.f);
}

INSTANTIATE_TEST_SUITE_P(Backends, Recovery, testing::Values(hr::BackendKind::cpu, hr::BackendKind::cuda),
                         hr::test::backend_param_name);

}  // namespace
