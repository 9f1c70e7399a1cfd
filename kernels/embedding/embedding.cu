// Embedding on CUDA: entry points (kernels land next; until then a CUDA call throws).
#include "harness/check.hpp"
#include "kernels/embedding/embedding_cuda.hpp"

namespace hr::ops::cuda {
void embedding_forward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, Tensor&) {
  throw Error("embedding_forward: no CUDA kernel in this build");
}
void embedding_backward_rows(const emb::InverseIndex&, const Tensor&, Tensor&) {
  throw Error("embedding_backward: no CUDA kernel in this build");
}
}  // namespace hr::ops::cuda
