// Cross-entropy on CUDA: entry points (kernels land next; until then a CUDA call throws).
#include "harness/check.hpp"
#include "kernels/crossentropy/crossentropy_cuda.hpp"

namespace hr::ops::cuda {
void cross_entropy_losses(const Tensor&, const Tensor&, int32_t, Tensor&) {
  throw Error("cross_entropy_forward: no CUDA kernel in this build");
}
void cross_entropy_backward(const Tensor&, const Tensor&, int32_t, float, Tensor&) {
  throw Error("cross_entropy_backward: no CUDA kernel in this build");
}
}  // namespace hr::ops::cuda
