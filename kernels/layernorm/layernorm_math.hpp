// LayerNorm scalar math shared by the CPU loop and the CUDA kernels (HR_HD), so
// both backends normalise and differentiate with the same expressions.
// BatchNorm reuses it: per channel instead of per row, the algebra is the same.
#pragma once

#include <cmath>

#include "kernels/common/hd.hpp"

namespace hr::ops::norm {

// 1 / sqrt(var + eps) with IEEE sqrt and division on both backends (not rsqrtf,
// whose approximation would make the GPU disagree with the CPU in the last bits).
HR_HD float rstd_from_var(float var, float eps) { return 1.f / sqrtf(var + eps); }

HR_HD float normalize(float x, float mean, float rstd, float gamma, float beta) {
  return (x - mean) * rstd * gamma + beta;
}

// dn = dy * gamma, rounded to fp32 on its own on both backends. nvcc would otherwise
// fuse the product into the sum or difference that follows (an FMA keeps it exact),
// so dn and the group's mean of dn would differ by the product's rounding error and
// a one-element group, whose dx is exactly zero, would get a non-zero one.
HR_HD float scaled_grad(float dy, float gamma) {
#ifdef __CUDA_ARCH__
  return __fmul_rn(dy, gamma);
#else
  return dy * gamma;
#endif
}

// d(loss)/dx of one element of a normalised group, with dn = dy * gamma:
// dx = rstd * (dn - mean(dn) - xhat * mean(dn * xhat)), means over the group.
HR_HD float dx(float dn, float xhat, float rstd, float mean_dn, float mean_dn_xhat) {
  return rstd * (dn - mean_dn - xhat * mean_dn_xhat);
}

}  // namespace hr::ops::norm
