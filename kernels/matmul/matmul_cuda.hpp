// CUDA entry points of the matrix products (kernels/matmul/matmul.cu), as plain
// C++ so kernels/matmul/matmul.cpp can call them without CUDA headers. Arguments
// are already checked; sizes are row-major M, N, K and a batch count.
#pragma once

#include <cstdint>

#include "harness/tensor.hpp"

namespace hr::ops::cuda {

// c[i] = alpha * op(a[i]) op(b[i]) + beta * c[i] for i < batch (strided, contiguous).
void matmul(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, Tensor& c, int64_t batch, int64_t m,
            int64_t n, int64_t k, float alpha, float beta);

}  // namespace hr::ops::cuda
