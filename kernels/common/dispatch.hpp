// Dispatch helpers for op entry points: the CUDA branch exists only in CUDA
// builds; a CUDA tensor reaching a CPU-only build is an error, not a silent CPU run.
#pragma once

#include "harness/check.hpp"
#include "harness/op_profile.hpp"
#include "harness/tensor.hpp"

// Each also opens the op's region for an active op profile (harness/op_profile.hpp),
// named after the enclosing function and held to its end, on either backend; use it
// once per function.
#if HEADROOM_HAVE_CUDA
#define HR_IF_CUDA(tensor, ...)                           \
  const ::hr::OpTimer hr_op_timer_((tensor), __func__); \
  if ((tensor).is_cuda()) {                               \
    __VA_ARGS__;                                          \
    return;                                               \
  }
#else
#define HR_IF_CUDA(tensor, ...)                           \
  const ::hr::OpTimer hr_op_timer_((tensor), __func__); \
  HR_CHECK(!(tensor).is_cuda(), "{}: this build of headroom has no CUDA backend", __func__);
#endif
