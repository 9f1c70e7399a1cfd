// Per-element optimizer updates, shared by the CPU loops and the CUDA kernels, in
// PyTorch's order of operations (torch.optim.SGD with dampening 0 and no
// Nesterov; torch.optim.AdamW). The parameter is updated in fp32 and the caller
// stores it in its own dtype: an fp16 parameter whose update is below half an ulp
// keeps its value (MP-4).
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/common/hd.hpp"

namespace hr::optim {

struct SgdScalars {
  float lr, momentum, weight_decay;
  bool use_momentum;
};

// PyTorch: d = g + wd p; buf = momentum buf + d (buf starts at zero, so the first
// step gives buf = d as PyTorch's clone does); p -= lr buf.
HR_HD float sgd(float p, float g, float* buf, const SgdScalars& s) {
  float d = g + s.weight_decay * p;
  if (s.use_momentum) {
    *buf = s.momentum * *buf + d;
    d = *buf;
  }
  return p - s.lr * d;
}

struct AdamWScalars {
  float lr, beta1, beta2, eps, weight_decay;
  float step_size;           // lr / (1 - beta1^step)
  float bias_correction2_sqrt;  // sqrt(1 - beta2^step)
};

// The per-step scalars, bias corrections in double on the host, once per step
// (shared by the fp32 and the 8-bit AdamW so that both take the same step).
inline AdamWScalars adamw_scalars(float lr, float beta1, float beta2, float eps, float weight_decay, int64_t step) {
  const double bc1 = 1.0 - std::pow(static_cast<double>(beta1), static_cast<double>(step));
  const double bc2 = 1.0 - std::pow(static_cast<double>(beta2), static_cast<double>(step));
  return AdamWScalars{lr, beta1, beta2, eps, weight_decay, static_cast<float>(lr / bc1),
                      static_cast<float>(std::sqrt(bc2))};
}

// PyTorch: p *= 1 - lr wd; m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
// p -= step_size m / (sqrt(v) / sqrt(bc2) + eps).
HR_HD float adamw(float p, float g, float* m, float* v, const AdamWScalars& s) {
  p *= 1.f - s.lr * s.weight_decay;
  *m = s.beta1 * *m + (1.f - s.beta1) * g;
  *v = s.beta2 * *v + (1.f - s.beta2) * g * g;
  const float denom = sqrtf(*v) / s.bias_correction2_sqrt + s.eps;
  return p - s.step_size * (*m / denom);
}

}  // namespace hr::optim
