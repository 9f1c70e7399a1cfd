// GELU, tanh form: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), as in GPT-2
// and PyTorch's approximate="tanh".
#pragma once

#include "harness/tensor.hpp"

namespace hr::ops {

void gelu_forward(const Tensor& x, Tensor& y);
void gelu_backward(const Tensor& x, const Tensor& dy, Tensor& dx);  // dx = dy * gelu'(x)

}  // namespace hr::ops
