// raise_smem_limit (see cuda_launch.cuh).
#include "kernels/common/cuda_launch.cuh"

#include <map>
#include <mutex>
#include <utility>

#include "harness/cuda_check.cuh"

namespace hr::gpu {

void raise_smem_limit(const void* kernel, size_t bytes, int device) {
  static std::mutex mutex;
  static std::map<std::pair<const void*, int>, size_t> raised;  // (kernel, device) -> bytes
  const std::lock_guard<std::mutex> lock(mutex);
  const auto at = raised.find({kernel, device});
  if (at != raised.end() && at->second >= bytes) return;
  int current = 0;
  HR_CUDA_CHECK(cudaGetDevice(&current));
  if (current != device) HR_CUDA_CHECK(cudaSetDevice(device));
  const cudaError_t e =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
  if (current != device) HR_CUDA_CHECK(cudaSetDevice(current));
  HR_CUDA_CHECK(e);
  raised[{kernel, device}] = bytes;
}

}  // namespace hr::gpu
