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
  const ScopedCudaDevice on(device);
  HR_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
  raised[{kernel, device}] = bytes;
}

}  // namespace hr::gpu
