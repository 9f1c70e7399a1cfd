// Matrix products with fp32 accumulation: cuBLAS on the GPU (cublasGemmEx /
// cublasGemmStridedBatchedEx with CUBLAS_COMPUTE_32F: no TF32, no reduced-precision
// reductions), CBLAS (OpenBLAS) on the CPU (fp16/bf16 inputs widened to fp32).
// Row-major throughout. Inputs fp32/fp16/bf16 (a and b the same dtype); c may be
// that dtype or fp32.
#pragma once

#include "harness/tensor.hpp"

namespace hr::ops {

// c = alpha * op(a) op(b) + beta * c, with op(a) [M, K], op(b) [K, N], c [M, N].
// a is [M, K] or, transposed, [K, M]; likewise b.
void matmul(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, Tensor& c, float alpha = 1.f,
            float beta = 0.f);
// The same per batch entry over a leading batch dimension: a [Bt, ., .], b [Bt, ., .], c [Bt, M, N].
void matmul_batched(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, Tensor& c, float alpha = 1.f,
                    float beta = 0.f);

// Linear layer with PyTorch's weight layout: x [N, in], w [out, in], b [out] (may be
// undefined), y [N, out] = x w^T + b.
// On the CPU with an fp32 y, y starts as the bias rows and the product is added into
// it (sgemm's beta = 1, as PyTorch's addmm): one pass over y fewer than a product and
// then a bias add. The bits are those of the product followed by the add, except
// where OpenBLAS splits K into panels: there the bias joins the first panel's sum.
void linear_forward(const Tensor& x, const Tensor& w, const Tensor& b, Tensor& y);

// How linear_backward writes dx: overwritten with dy w, or dy w added to what dx
// holds (beta = 1), for an input that feeds several layers (q, k and v read one ln1).
enum class DxWrite { overwrite, accumulate };
// dx = dy w (or dx += dy w), dw += dy^T x, db += sum_n dy; each skipped when its
// tensor is undefined (dw undefined: a frozen weight owns no gradient buffer).
void linear_backward(const Tensor& x, const Tensor& w, const Tensor& dy, Tensor& dx, Tensor& dw, Tensor& db,
                     DxWrite dx_write = DxWrite::overwrite);

}  // namespace hr::ops
