// Dispatch helpers for op entry points: the CUDA branch exists only in CUDA
// builds; a CUDA tensor reaching a CPU-only build is an error, not a silent CPU run.
#pragma once

#include "harness/check.hpp"
#include "harness/tensor.hpp"

#if HEADROOM_HAVE_CUDA
#define HR_IF_CUDA(tensor, ...) \
  if ((tensor).is_cuda()) {     \
    __VA_ARGS__;                \
    return;                     \
  }
#else
#define HR_IF_CUDA(tensor, ...) \
  HR_CHECK(!(tensor).is_cuda(), "{}: this build of headroom has no CUDA backend", __func__);
#endif
