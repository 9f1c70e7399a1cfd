// Masked softmax on CUDA: entry points (kernels land next; until then a CUDA call throws).
#include "harness/check.hpp"
#include "kernels/softmax/softmax_cuda.hpp"

namespace hr::ops::cuda {
void softmax_forward(const Tensor&, const AttnMask&, float, Tensor&) {
  throw Error("softmax_forward: no CUDA kernel in this build");
}
void softmax_backward(const Tensor&, const Tensor&, float, Tensor&) {
  throw Error("softmax_backward: no CUDA kernel in this build");
}
}  // namespace hr::ops::cuda
