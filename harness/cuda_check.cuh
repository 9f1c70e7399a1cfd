// Check macros for CUDA runtime and cuBLAS calls (CUDA translation units only):
// each names the call, the error, the file and the line, and throws hr::Error
// (hr::OutOfMemory for allocation failures, so callers can recover).
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "harness/check.hpp"

namespace hr::detail {
[[noreturn]] inline void throw_cuda(cudaError_t e, const char* call, const char* file, int line) {
  // The error travels in the exception: a caller that recovers (an OutOfMemory
  // caught) must not see it again at the next launch's check. A sticky error stays
  // the context's whatever is cleared here.
  (void)cudaGetLastError();
  const std::string msg = fmt::format("CUDA error {} ({}) in {} ({}:{})", cudaGetErrorName(e),
                                      cudaGetErrorString(e), call, file, line);
  if (e == cudaErrorMemoryAllocation) throw OutOfMemory(msg);
  throw Error(msg);
}
[[noreturn]] inline void throw_cublas(cublasStatus_t s, const char* call, const char* file, int line) {
  const std::string msg = fmt::format("cuBLAS error {} ({}) in {} ({}:{})", cublasGetStatusName(s),
                                      cublasGetStatusString(s), call, file, line);
  if (s == CUBLAS_STATUS_ALLOC_FAILED) throw OutOfMemory(msg);
  throw Error(msg);
}
}  // namespace hr::detail

#define HR_CUDA_CHECK(call)                                                          \
  do {                                                                               \
    const cudaError_t hr_err_ = (call);                                              \
    if (hr_err_ != cudaSuccess) ::hr::detail::throw_cuda(hr_err_, #call, __FILE__, __LINE__); \
  } while (0)

// After every kernel launch.
#define HR_CUDA_CHECK_LAUNCH() HR_CUDA_CHECK(cudaGetLastError())

#define HR_CUBLAS_CHECK(call)                                                            \
  do {                                                                                   \
    const cublasStatus_t hr_st_ = (call);                                                \
    if (hr_st_ != CUBLAS_STATUS_SUCCESS) ::hr::detail::throw_cublas(hr_st_, #call, __FILE__, __LINE__); \
  } while (0)

namespace hr {
// Makes CUDA device `ordinal` current for its scope and puts the previous one back:
// per-device state (a module's globals, events, function attributes) is that of the
// current device.
class ScopedCudaDevice {
 public:
  explicit ScopedCudaDevice(int ordinal) {
    HR_CUDA_CHECK(cudaGetDevice(&previous_));
    if (previous_ != ordinal) HR_CUDA_CHECK(cudaSetDevice(ordinal));
    changed_ = previous_ != ordinal;
  }
  ~ScopedCudaDevice() {
    if (changed_) cudaSetDevice(previous_);
  }
  ScopedCudaDevice(const ScopedCudaDevice&) = delete;
  ScopedCudaDevice& operator=(const ScopedCudaDevice&) = delete;

 private:
  int previous_ = 0;
  bool changed_ = false;
};
}  // namespace hr
