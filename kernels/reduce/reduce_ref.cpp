// Float64 references of the reductions (see reduce_ref.hpp).
#include "kernels/reduce/reduce_ref.hpp"

namespace hr::ref {

double sum(const std::vector<double>& x) {
  double s = 0;
  for (double v : x) s += v;
  return s;
}

double squared_norm(const std::vector<double>& x) {
  double s = 0;
  for (double v : x) s += v * v;
  return s;
}

}  // namespace hr::ref
