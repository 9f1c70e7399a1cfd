// Element-wise ops over tensors of equal shape: add, scale, axpy, cast, fill,
// and bias add / bias gradient for [N, C] rows. Any float dtype, fp32 compute.
#pragma once

#include "harness/tensor.hpp"

namespace hr::ops {

void add(const Tensor& a, const Tensor& b, Tensor& out);       // out = a + b (out may alias a or b)
void scale(const Tensor& x, float alpha, Tensor& out);         // out = alpha * x (may alias)
void axpy(float alpha, const Tensor& x, Tensor& y);            // y += alpha * x
void cast(const Tensor& x, Tensor& out);                       // dtype conversion, same shape
void fill(Tensor& out, float value);                           // every element = value (rounded)
void add_bias(Tensor& y, const Tensor& bias);                  // y[n, c] += bias[c]; y is [N, C]
void bias_grad(const Tensor& dy, Tensor& dbias);               // dbias[c] += sum_n dy[n, c]

}  // namespace hr::ops
