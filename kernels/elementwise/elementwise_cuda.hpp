// CUDA entry points of the element-wise ops (defined in elementwise.cu, called
// from elementwise.cpp after its checks). Plain C++: no CUDA types.
#pragma once

#include "harness/tensor.hpp"

namespace hr::ops::cuda {

void add(const Tensor& a, const Tensor& b, Tensor& out);
void scale(const Tensor& x, float alpha, Tensor& out);
void axpy(float alpha, const Tensor& x, Tensor& y);
void cast(const Tensor& x, Tensor& out);
void fill(Tensor& out, float value);
void add_bias(Tensor& y, const Tensor& bias);
void bias_grad(const Tensor& dy, Tensor& dbias);

}  // namespace hr::ops::cuda
