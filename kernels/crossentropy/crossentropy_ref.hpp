// Float64 reference of the fused cross-entropy over logits [N, V], deliberately
// simple: the oracle of OPS-1 / OPS-2 and of the reduction / ignore-index tests.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/crossentropy/crossentropy.hpp"

namespace hr::ref {

using vecd = std::vector<double>;

// Returns the reduced loss; losses [N] gets per-token losses (0 when ignored).
double cross_entropy_forward(const vecd& logits, const std::vector<int32_t>& targets, int64_t V,
                             const ops::CrossEntropyConfig& cfg, vecd& losses);
// dlogits = loss_scale * d(reduced loss)/d(logits).
void cross_entropy_backward(const vecd& logits, const std::vector<int32_t>& targets, int64_t V,
                            const ops::CrossEntropyConfig& cfg, vecd& dlogits);

}  // namespace hr::ref
