// LayerNorm on CUDA: entry points (kernels land next; until then a CUDA call throws).
#include "harness/check.hpp"
#include "kernels/layernorm/layernorm_cuda.hpp"

namespace hr::ops::cuda {
void layernorm_forward(const Tensor&, const Tensor&, const Tensor&, float, Tensor&, Tensor&, Tensor&) {
  throw Error("layernorm_forward: no CUDA kernel in this build");
}
void layernorm_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, Tensor&, Tensor&,
                        Tensor&) {
  throw Error("layernorm_backward: no CUDA kernel in this build");
}
}  // namespace hr::ops::cuda
