// Float64 reference of LayerNorm over [N, C] rows, deliberately simple: the oracle
// of the conformance tests (OPS-1) and of their finite differences (OPS-2).
#pragma once

#include <cstdint>
#include <vector>

namespace hr::ref {

using vecd = std::vector<double>;

// mean, rstd: [N]. Biased variance, as the op.
void layernorm_forward(const vecd& x, const vecd& gamma, const vecd& beta, int64_t N, int64_t C, double eps,
                       vecd& y, vecd& mean, vecd& rstd);
// dx = gradient; dgamma, dbeta = gradient (not accumulated).
void layernorm_backward(const vecd& dy, const vecd& x, const vecd& gamma, int64_t N, int64_t C, double eps,
                        vecd& dx, vecd& dgamma, vecd& dbeta);

}  // namespace hr::ref
