// CUDA entry points of the masked row softmax (defined in softmax.cu, called from
// softmax.cpp after its argument checks). Plain C++: no CUDA types.
#pragma once

#include "harness/tensor.hpp"
#include "kernels/softmax/softmax.hpp"

namespace hr::ops::cuda {

void softmax_forward(const Tensor& scores, const AttnMask& mask, float scale, Tensor& probs);
void softmax_backward(const Tensor& probs, const Tensor& dprobs, float scale, Tensor& dscores);

}  // namespace hr::ops::cuda
