// Float64 reference of BatchNorm over x [N, C] (statistics per channel over n),
// deliberately simple: the oracle of OPS-1 / OPS-2 and of the running statistics.
#pragma once

#include <cstdint>
#include <vector>

namespace hr::ref {

using vecd = std::vector<double>;

// Training forward: y, and running_mean / running_var updated in place with the
// unbiased batch variance.
void batchnorm_forward_train(const vecd& x, const vecd& gamma, const vecd& beta, int64_t N, int64_t C, double eps,
                             double momentum, vecd& running_mean, vecd& running_var, vecd& y);
void batchnorm_forward_eval(const vecd& x, const vecd& gamma, const vecd& beta, int64_t N, int64_t C, double eps,
                            const vecd& running_mean, const vecd& running_var, vecd& y);
// Gradients of the training forward (batch statistics), not accumulated.
void batchnorm_backward(const vecd& dy, const vecd& x, const vecd& gamma, int64_t N, int64_t C, double eps,
                        vecd& dx, vecd& dgamma, vecd& dbeta);

}  // namespace hr::ref
