// Linked into every test executable with GPU tests: before main, and so before CUDA
// starts, the GPUs CTest allocated to this test become its CUDA_VISIBLE_DEVICES
// (harness/ctest_gpus.hpp; ctest --resource-spec-file, ci/ctest-resources).
#include "harness/ctest_gpus.hpp"

namespace {
struct CtestGpuBinding {
  CtestGpuBinding() { hr::bind_ctest_gpus(); }
};
// Early among this executable's initialisers (GCC's init_priority), so that none of
// them can have started CUDA on another device first.
__attribute__((init_priority(101))) const CtestGpuBinding kBinding;
}  // namespace
