// MSE loss on the GPU: per-element squared errors (summed by the deterministic
// reduce op) and the scaled gradient; element math from mse_math.hpp.
#include "harness/cuda_check.cuh"
#include "kernels/common/float16.hpp"
#include "kernels/mse/mse_cuda.hpp"
#include "kernels/mse/mse_math.hpp"

namespace hr::ops::cuda {
namespace {

__device__ float load_any(const void* p, DType t, int64_t i) {
  switch (t) {
    case DType::f16: return to_float(static_cast<const half_t*>(p)[i]);
    case DType::bf16: return to_float(static_cast<const bfloat16_t*>(p)[i]);
    default: return static_cast<const float*>(p)[i];
  }
}

__global__ void mse_elementwise_kernel(const void* pred, DType pt, const void* target, DType tt, float* out,
                                       int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = mse_elem_loss(load_any(pred, pt, i), load_any(target, tt, i));
}

template <typename T>
__global__ void mse_backward_kernel(const void* pred, DType pt, const void* target, DType tt, float factor, T* out,
                                    int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = from_float<T>(mse_elem_grad(load_any(pred, pt, i), load_any(target, tt, i), factor));
}

constexpr int kThreads = 256;
unsigned blocks_for(int64_t n) { return static_cast<unsigned>((n + kThreads - 1) / kThreads); }

}  // namespace

void mse_elementwise(const Tensor& pred, const Tensor& target, Tensor& losses) {
  const int64_t n = pred.numel();
  if (n == 0) return;
  auto stream = static_cast<cudaStream_t>(pred.device().cuda_stream());
  mse_elementwise_kernel<<<blocks_for(n), kThreads, 0, stream>>>(pred.data(), pred.dtype(), target.data(),
                                                                 target.dtype(), losses.data_as<float>(), n);
  HR_CUDA_CHECK_LAUNCH();
}

void mse_backward(const Tensor& pred, const Tensor& target, float factor, Tensor& dpred) {
  const int64_t n = pred.numel();
  if (n == 0) return;
  auto stream = static_cast<cudaStream_t>(pred.device().cuda_stream());
  switch (dpred.dtype()) {
    case DType::f16:
      mse_backward_kernel<half_t><<<blocks_for(n), kThreads, 0, stream>>>(
          pred.data(), pred.dtype(), target.data(), target.dtype(), factor, dpred.data_as<half_t>(), n);
      break;
    case DType::bf16:
      mse_backward_kernel<bfloat16_t><<<blocks_for(n), kThreads, 0, stream>>>(
          pred.data(), pred.dtype(), target.data(), target.dtype(), factor, dpred.data_as<bfloat16_t>(), n);
      break;
    default:
      mse_backward_kernel<float><<<blocks_for(n), kThreads, 0, stream>>>(
          pred.data(), pred.dtype(), target.data(), target.dtype(), factor, dpred.data_as<float>(), n);
      break;
  }
  HR_CUDA_CHECK_LAUNCH();
}

}  // namespace hr::ops::cuda
