// LayerNorm on CUDA. Forward and dx: one row per warp (C <= 512, several rows per
// block) or per block, two-pass statistics from 16-byte packed loads, fp32 math
// from layernorm_math.hpp. dgamma / dbeta: deterministic column sums (per-chunk
// partials, then a fixed-order final sum), added (+=) to the gradients.
#include "harness/cuda_check.cuh"
#include "kernels/common/cuda_rowwise.cuh"
#include "kernels/common/dtype_dispatch.hpp"
#include "kernels/layernorm/layernorm_cuda.hpp"
#include "kernels/layernorm/layernorm_math.hpp"

namespace hr::ops::cuda {
namespace {

template <typename T, typename W>
__global__ void forward_kernel(const T* x, const W* gamma, const W* beta, float eps, T* y, float* mean, float* rstd,
                               int64_t N, int64_t C, bool vec) {
  __shared__ gpu::RowScratch scratch[4];
  const int64_t n = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y;
  if (n >= N) return;  // uniform per row; rows of one block only share scratch when a row is one warp
  gpu::RowScratch& sh = scratch[threadIdx.y];
  const T* xr = x + n * C;
  float s = 0.f;
  gpu::row_read(xr, C, vec, [&](int64_t, float v) { s += v; });
  const float m = gpu::row_sum(s, sh) / static_cast<float>(C);
  float q = 0.f;
  gpu::row_read(xr, C, vec, [&](int64_t, float v) { q += (v - m) * (v - m); });
  const float r = norm::rstd_from_var(gpu::row_sum(q, sh) / static_cast<float>(C), eps);
  if (threadIdx.x == 0) {
    mean[n] = m;
    rstd[n] = r;
  }
  gpu::row_write(y + n * C, xr, xr, C, vec, [&](int64_t c, float v, float) {
    return norm::normalize(v, m, r, to_float(gamma[c]), to_float(beta[c]));
  });
}

template <typename T, typename W>
__global__ void dx_kernel(const T* dy, const T* x, const W* gamma, const float* mean, const float* rstd, T* dx,
                          int64_t N, int64_t C, bool vec) {
  __shared__ gpu::RowScratch scratch[4];
  const int64_t n = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y;
  if (n >= N) return;
  gpu::RowScratch& sh = scratch[threadIdx.y];
  const float m = mean[n], r = rstd[n];
  const T* xr = x + n * C;
  const T* dyr = dy + n * C;
  float sdn = 0.f, sdnx = 0.f;
  gpu::row_read(dyr, C, vec, [&](int64_t c, float d) {
    const float dn = norm::scaled_grad(d, to_float(gamma[c]));
    sdn += dn;
    sdnx += dn * ((to_float(xr[c]) - m) * r);
  });
  const float mdn = gpu::row_sum(sdn, sh) / static_cast<float>(C);
  const float mdnx = gpu::row_sum(sdnx, sh) / static_cast<float>(C);
  gpu::row_write(dx + n * C, dyr, xr, C, vec, [&](int64_t c, float d, float xv) {
    return norm::dx(norm::scaled_grad(d, to_float(gamma[c])), (xv - m) * r, r, mdn, mdnx);
  });
}

// dgamma[c] += sum_n dy * xhat, dbeta[c] += sum_n dy.
template <typename T>
struct ParamTerm {
  const T* dy;
  const T* x;
  const float* mean;
  const float* rstd;
  int64_t C;
  __device__ void operator()(int64_t n, int64_t c, float (&v)[2]) const {
    const float d = to_float(dy[n * C + c]);
    v[0] = d * ((to_float(x[n * C + c]) - mean[n]) * rstd[n]);
    v[1] = d;
  }
};
struct ParamFinish {
  float* dgamma;
  float* dbeta;
  __device__ void operator()(int64_t c, const float (&s)[2]) const {
    dgamma[c] += s[0];
    dbeta[c] += s[1];
  }
};

template <typename T, typename F>
void with_weight_type(const Tensor& w, F&& f) {
  if (w.dtype() == DType::f32) f(float{});
  else f(T{});
}

}  // namespace

void layernorm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps, Tensor& y,
                       Tensor& mean, Tensor& rstd) {
  const int64_t C = x.dim(-1), N = x.numel() / C;
  const dim3 block = gpu::row_block(C);
  dispatch_float(x.dtype(), "layernorm_forward", [&](auto xt) {
    using T = decltype(xt);
    with_weight_type<T>(gamma, [&](auto wt) {
      using W = decltype(wt);
      const bool vec = gpu::rows_packable(x.data_as<T>(), C) && gpu::rows_packable(y.data_as<T>(), C);
      forward_kernel<T, W><<<gpu::row_grid(N, block), block, 0, gpu::stream_of(x)>>>(
          x.data_as<T>(), gamma.data_as<W>(), beta.data_as<W>(), eps, y.data_as<T>(), mean.data_as<float>(),
          rstd.data_as<float>(), N, C, vec);
      HR_CUDA_CHECK_LAUNCH();
    });
  });
}

void layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& mean,
                        const Tensor& rstd, Tensor& dx, Tensor& dgamma, Tensor& dbeta) {
  const int64_t C = x.dim(-1), N = x.numel() / C;
  const dim3 block = gpu::row_block(C);
  const cudaStream_t s = gpu::stream_of(x);
  Tensor partial = Tensor::empty(x.device(), {gpu::col_sum_workspace(N, C, 2)}, DType::f32, Consumer::workspace);
  dispatch_float(x.dtype(), "layernorm_backward", [&](auto xt) {
    using T = decltype(xt);
    with_weight_type<T>(gamma, [&](auto wt) {
      using W = decltype(wt);
      const bool vec = gpu::rows_packable(dy.data_as<T>(), C) && gpu::rows_packable(x.data_as<T>(), C) &&
                       gpu::rows_packable(dx.data_as<T>(), C);
      dx_kernel<T, W><<<gpu::row_grid(N, block), block, 0, s>>>(dy.data_as<T>(), x.data_as<T>(), gamma.data_as<W>(),
                                                                 mean.data_as<float>(), rstd.data_as<float>(),
                                                                 dx.data_as<T>(), N, C, vec);
      HR_CUDA_CHECK_LAUNCH();
    });
    gpu::col_sums<2>(N, C, ParamTerm<T>{dy.data_as<T>(), x.data_as<T>(), mean.data_as<float>(), rstd.data_as<float>(), C},
                     ParamFinish{dgamma.data_as<float>(), dbeta.data_as<float>()}, partial.data_as<float>(), s);
  });
}

}  // namespace hr::ops::cuda
