// Linked into every test executable with GPU tests: before main, and so before CUDA
// starts, the GPUs CTest allocated to this test become its CUDA_VISIBLE_DEVICES
// (harness/ctest_gpus.hpp; ctest --resource-spec-file, ci/ctest-resources).
#include "harness/ctest_gpus.hpp"

namespace {
const bool kBound = (hr::bind_ctest_gpus(), true);
}  // namespace
