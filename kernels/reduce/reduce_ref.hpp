// Float64 references of the reductions for OPS-1: plain loops over doubles.
#pragma once

#include <vector>

namespace hr::ref {

double sum(const std::vector<double>& x);
double squared_norm(const std::vector<double>& x);

}  // namespace hr::ref
