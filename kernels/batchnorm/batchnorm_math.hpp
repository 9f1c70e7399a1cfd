// BatchNorm scalar math shared by both backends. Normalisation and its gradient
// are LayerNorm's (kernels/layernorm/layernorm_math.hpp) applied per channel; what
// is BatchNorm's own is the running-statistics update.
#pragma once

#include "kernels/common/hd.hpp"
#include "kernels/layernorm/layernorm_math.hpp"

namespace hr::ops::bn {

// running = (1 - momentum) * running + momentum * batch (PyTorch's convention).
HR_HD float running_update(float running, float batch, float momentum) {
  return (1.f - momentum) * running + momentum * batch;
}

// Unbiased variance from the biased one over n values: var * n / (n - 1).
HR_HD float unbiased_var(float biased_var, float n) { return biased_var * (n / (n - 1.f)); }

}  // namespace hr::ops::bn
