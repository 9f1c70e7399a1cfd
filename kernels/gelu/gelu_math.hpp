// GELU, tanh form, as one scalar function pair shared by the CPU loop and the
// CUDA kernel: y = 0.5 x (1 + tanh u), u = sqrt(2/pi) (x + 0.044715 x^3).
// Evaluated through the identity 0.5 (1 + tanh u) = sigmoid(2u): in the negative
// tail 1 + tanh u cancels catastrophically in fp32 (relative error ~1e-4 at
// x = -4), while x * sigmoid(2u) keeps a few ulp everywhere. Likewise
// 1 - tanh^2 u = 4 sigmoid(2u) sigmoid(-2u) in the derivative
// dy/dx = sigmoid(2u) + 2 x sigmoid(2u) sigmoid(-2u) u'(x).
#pragma once

#include <cmath>

#include "kernels/common/hd.hpp"

namespace hr::gelu {

inline constexpr float kSqrt2OverPi = 0.7978845608028654f;
inline constexpr float kCubic = 0.044715f;

HR_HD float inner(float x) { return kSqrt2OverPi * (x + kCubic * x * x * x); }

// 1 / (1 + e^-z): 0 or 1 at the extremes (expf overflows to inf, 1/inf = 0), never NaN.
HR_HD float sigmoid(float z) { return 1.f / (1.f + expf(-z)); }

HR_HD float forward(float x) { return x * sigmoid(2.f * inner(x)); }

HR_HD float backward(float x, float dy) {
  const float u2 = 2.f * inner(x);
  // One exponential for both: s = 1 / (1 + e) and sm = 1 - s = e / (1 + e) = e s,
  // without cancellation; where e overflows (s = 0), sm is 1.
  const float e = expf(-u2);
  const float s = 1.f / (1.f + e);
  const float sm = e <= 3.4e38f ? e * s : 1.f;
  const float du = kSqrt2OverPi * (1.f + 3.f * kCubic * x * x);
  return dy * (s + 2.f * x * s * sm * du);
}

}  // namespace hr::gelu
