// Host/device qualifiers for the scalar math that both backends share.
// Under nvcc a function marked HR_HD compiles for the host and the device; under a
// plain C++ compiler it is an ordinary inline function. Only launch code,
// shared-memory reductions and cuBLAS calls may be CUDA-only.
#pragma once

#if defined(__CUDACC__)
#define HR_HD __host__ __device__ __forceinline__
#define HR_DEVICE_CODE 1
#else
#define HR_HD inline
#define HR_DEVICE_CODE 0
#endif
