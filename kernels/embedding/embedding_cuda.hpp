// CUDA entry points of the embedding (defined in embedding.cu, called from
// embedding.cpp after its checks, which also build the inverse indices on the host).
#pragma once

#include "harness/tensor.hpp"
#include "kernels/embedding/embedding_math.hpp"

namespace hr::ops::cuda {

void embedding_forward(const Tensor& ids, const Tensor& pos, const Tensor& wte, const Tensor& wpe, Tensor& out);
// dw[ix.ids[k]] += sum of dout rows ix.tokens[offsets[k] .. offsets[k+1]) in that order.
void embedding_backward_rows(const emb::InverseIndex& ix, const Tensor& dout, Tensor& dw);

}  // namespace hr::ops::cuda
