// Float64 reference of the token + position embedding, deliberately simple: the
// oracle of OPS-1 / OPS-2.
#pragma once

#include <cstdint>
#include <vector>

namespace hr::ref {

using vecd = std::vector<double>;

// ids, pos: [N] (N = B * T tokens); wte [V, C]; wpe [P, C]; out [N, C].
void embedding_forward(const std::vector<int32_t>& ids, const std::vector<int32_t>& pos, const vecd& wte,
                       const vecd& wpe, int64_t C, vecd& out);
// dwte [V, C], dwpe [P, C]: gradients (not accumulated).
void embedding_backward(const std::vector<int32_t>& ids, const std::vector<int32_t>& pos, const vecd& dout,
                        int64_t V, int64_t P, int64_t C, vecd& dwte, vecd& dwpe);

}  // namespace hr::ref
