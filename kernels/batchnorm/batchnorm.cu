// BatchNorm on CUDA: entry points (kernels land next; until then a CUDA call throws).
#include "harness/check.hpp"
#include "kernels/batchnorm/batchnorm_cuda.hpp"

namespace hr::ops::cuda {
void batchnorm_forward_train(const Tensor&, const Tensor&, const Tensor&, float, float, Tensor&, Tensor&, Tensor&,
                             Tensor&, Tensor&) {
  throw Error("batchnorm_forward_train: no CUDA kernel in this build");
}
void batchnorm_forward_eval(const Tensor&, const Tensor&, const Tensor&, float, const Tensor&, const Tensor&,
                            Tensor&) {
  throw Error("batchnorm_forward_eval: no CUDA kernel in this build");
}
void batchnorm_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, Tensor&, Tensor&,
                        Tensor&) {
  throw Error("batchnorm_backward: no CUDA kernel in this build");
}
}  // namespace hr::ops::cuda
