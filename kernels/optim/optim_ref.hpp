// Float64 references of SGD and AdamW over several steps, for OPS-1 and GA-3:
// plain loops over doubles, in the same order of operations as PyTorch, with no
// storage rounding anywhere.
#pragma once

#include <cstdint>
#include <vector>

namespace hr::ref {

struct OptimState {
  std::vector<double> param, buf1, buf2;  // SGD: buf1 = momentum; AdamW: buf1 = m, buf2 = v
};

// One SGD step (momentum 0: buf1 unused).
void sgd_step(OptimState& s, const std::vector<double>& grad, double lr, double momentum, double weight_decay);
// One AdamW step; step is 1-based.
void adamw_step(OptimState& s, const std::vector<double>& grad, int64_t step, double lr, double beta1, double beta2,
                double eps, double weight_decay);

}  // namespace hr::ref
