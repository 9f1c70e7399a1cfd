// Fused cross-entropy on CUDA: one warp (V <= 512) or one block per row. A row's
// log-sum-exp comes from one online (max, sum) pass over 16-byte packed loads;
// the loss kernel writes one fp32 per token (0 when ignored), which the host
// reduces in token order; the backward writes weight * (softmax - onehot).
#include "harness/cuda_check.cuh"
#include "kernels/common/cuda_rowwise.cuh"
#include "kernels/common/dtype_dispatch.hpp"
#include "kernels/crossentropy/crossentropy_cuda.hpp"
#include "kernels/crossentropy/crossentropy_math.hpp"
#include "kernels/softmax/softmax_math.hpp"

namespace hr::ops::cuda {
namespace {

template <typename T>
__device__ float row_lse(const T* xr, int64_t V, bool vec, gpu::RowScratch& sh) {
  float mx = -INFINITY, sum = 0.f;
  gpu::row_read(xr, V, vec, [&](int64_t, float v) { sm::online_add(mx, sum, v); });
  gpu::row_online(mx, sum, sh);
  return ce::logsumexp(mx, sum);
}

template <typename T>
__global__ void losses_kernel(const T* x, const int32_t* targets, int32_t ignore, float* losses, int64_t N, int64_t V,
                              bool vec) {
  __shared__ gpu::RowScratch scratch[4];
  const int64_t n = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y;
  if (n >= N) return;
  const int32_t t = targets[n];
  if (t == ignore) {  // uniform over the row's threads
    if (threadIdx.x == 0) losses[n] = 0.f;
    return;
  }
  const T* xr = x + n * V;
  const float lse = row_lse(xr, V, vec, scratch[threadIdx.y]);
  if (threadIdx.x == 0) losses[n] = ce::token_loss(lse, to_float(xr[t]));
}

template <typename T, typename D>
__global__ void backward_kernel(const T* x, const int32_t* targets, int32_t ignore, float weight, D* dx, int64_t N,
                                int64_t V, bool vec) {
  __shared__ gpu::RowScratch scratch[4];
  const int64_t n = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y;
  if (n >= N) return;
  const int32_t t = targets[n];
  const T* xr = x + n * V;
  if (t == ignore) {
    gpu::row_write(dx + n * V, xr, xr, V, vec, [](int64_t, float, float) { return 0.f; });
    return;
  }
  const float lse = row_lse(xr, V, vec, scratch[threadIdx.y]);
  gpu::row_write(dx + n * V, xr, xr, V, vec,
                 [&](int64_t v, float xv, float) { return ce::dlogit(xv, lse, v == t, weight); });
}

}  // namespace

void cross_entropy_losses(const Tensor& logits, const Tensor& targets, int32_t ignore_index, Tensor& losses) {
  const int64_t N = logits.dim(0), V = logits.dim(1);
  if (N == 0) return;
  const dim3 block = gpu::row_block(V);
  dispatch_float(logits.dtype(), "cross_entropy_forward", [&](auto tag) {
    using T = decltype(tag);
    const bool vec = gpu::rows_packable(logits.data_as<T>(), V);
    losses_kernel<T><<<gpu::row_grid(N, block), block, 0, gpu::stream_of(logits)>>>(
        logits.data_as<T>(), targets.data_as<int32_t>(), ignore_index, losses.data_as<float>(), N, V, vec);
    HR_CUDA_CHECK_LAUNCH();
  });
}

void cross_entropy_backward(const Tensor& logits, const Tensor& targets, int32_t ignore_index, float weight,
                            Tensor& dlogits) {
  const int64_t N = logits.dim(0), V = logits.dim(1);
  const dim3 block = gpu::row_block(V);
  dispatch_float(logits.dtype(), "cross_entropy_backward", [&](auto tag) {
    using T = decltype(tag);
    auto launch = [&](auto dtag) {
      using D = decltype(dtag);
      const bool vec = gpu::rows_packable(logits.data_as<T>(), V) && gpu::rows_packable(dlogits.data_as<D>(), V);
      backward_kernel<T, D><<<gpu::row_grid(N, block), block, 0, gpu::stream_of(logits)>>>(
          logits.data_as<T>(), targets.data_as<int32_t>(), ignore_index, weight, dlogits.data_as<D>(), N, V, vec);
      HR_CUDA_CHECK_LAUNCH();
    };
    if (dlogits.dtype() == DType::f32) launch(float{});
    else launch(T{});
  });
}

}  // namespace hr::ops::cuda
