// CUDA entry points of GELU (defined in gelu.cu, called from gelu.cpp after its
// checks). Plain C++: no CUDA types.
#pragma once

#include "harness/tensor.hpp"

namespace hr::ops::cuda {

void gelu_forward(const Tensor& x, Tensor& y);
void gelu_backward(const Tensor& x, const Tensor& dy, Tensor& dx);

}  // namespace hr::ops::cuda
