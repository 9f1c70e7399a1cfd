// Matrix products on the GPU: cuBLAS cublasGemmEx / cublasGemmStridedBatchedEx
// with CUBLAS_COMPUTE_32F (fp32 accumulation, no TF32), on the Device's handle and
// stream. cuBLAS is column-major: a row-major C = op(A) op(B) is computed as the
// column-major C^T = op(B)^T op(A)^T, which needs no copies.
#include <algorithm>

#include "harness/cuda_check.cuh"
#include "kernels/matmul/matmul_cuda.hpp"

namespace hr::ops::cuda {
namespace {

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::f32: return CUDA_R_32F;
    case DType::f16: return CUDA_R_16F;
    case DType::bf16: return CUDA_R_16BF;
    default: break;
  }
  HR_CHECK(false, "matmul: no cuBLAS type for {}", dtype_name(t));
  return CUDA_R_32F;
}

}  // namespace

void matmul(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, Tensor& c, int64_t batch, int64_t m,
            int64_t n, int64_t k, float alpha, float beta) {
  if (batch == 0 || m == 0 || n == 0) return;
  auto handle = static_cast<cublasHandle_t>(c.device().cublas_handle());
  HR_CHECK(handle != nullptr, "matmul: device {} has no cuBLAS handle", c.str());
  // Column-major view: C^T [n, m] = op(B)^T [n, k] op(A)^T [k, m].
  const cublasOperation_t op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const int ldb = static_cast<int>(std::max<int64_t>(1, trans_b ? k : n));
  const int lda = static_cast<int>(std::max<int64_t>(1, trans_a ? m : k));
  const int ldc = static_cast<int>(n);
  const cudaDataType_t ab_type = cuda_type(a.dtype());
  const cudaDataType_t c_type = cuda_type(c.dtype());
  if (batch == 1) {
    HR_CUBLAS_CHECK(cublasGemmEx(handle, op_b, op_a, static_cast<int>(n), static_cast<int>(m), static_cast<int>(k),
                                 &alpha, b.data(), ab_type, ldb, a.data(), ab_type, lda, &beta, c.data(), c_type,
                                 ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  } else {
    HR_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
        handle, op_b, op_a, static_cast<int>(n), static_cast<int>(m), static_cast<int>(k), &alpha, b.data(), ab_type,
        ldb, static_cast<long long>(k * n), a.data(), ab_type, lda, static_cast<long long>(m * k), &beta, c.data(),
        c_type, ldc, static_cast<long long>(m * n), static_cast<int>(batch), CUBLAS_COMPUTE_32F,
        CUBLAS_GEMM_DEFAULT));
  }
}

}  // namespace hr::ops::cuda
