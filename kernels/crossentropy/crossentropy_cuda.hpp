// CUDA entry points of the fused cross-entropy (defined in crossentropy.cu, called
// from crossentropy.cpp after its checks). Plain C++: no CUDA types.
#pragma once

#include <cstdint>

#include "harness/tensor.hpp"

namespace hr::ops::cuda {

// losses: fp32 [N], per-token loss (0 for ignored tokens), always written.
void cross_entropy_losses(const Tensor& logits, const Tensor& targets, int32_t ignore_index, Tensor& losses);
// dlogits = weight * (softmax - onehot) for real tokens, 0 for ignored ones.
void cross_entropy_backward(const Tensor& logits, const Tensor& targets, int32_t ignore_index, float weight,
                            Tensor& dlogits);

}  // namespace hr::ops::cuda
