// BatchNorm on CUDA over x [N, C]. Per-channel sums are deterministic column sums
// (kernels/common/cuda_rowwise.cuh: per-chunk partials, fixed-order final sum, no
// atomics): mean, then the centred variance (two passes, as the CPU), then the
// running statistics in the same finishing step. Normalisation and dx are
// element-wise grid-stride kernels over the per-channel values.
#include "harness/cuda_check.cuh"
#include "kernels/batchnorm/batchnorm_cuda.hpp"
#include "kernels/batchnorm/batchnorm_math.hpp"
#include "kernels/common/cuda_rowwise.cuh"
#include "kernels/common/dtype_dispatch.hpp"

namespace hr::ops::cuda {
namespace {

template <typename T>
struct XTerm {  // v = x
  const T* x;
  int64_t C;
  __device__ void operator()(int64_t n, int64_t c, float (&v)[1]) const { v[0] = to_float(x[n * C + c]); }
};
template <typename T>
struct SqTerm {  // v = (x - mean)^2
  const T* x;
  const float* mean;
  int64_t C;
  __device__ void operator()(int64_t n, int64_t c, float (&v)[1]) const {
    const float d = to_float(x[n * C + c]) - mean[c];
    v[0] = d * d;
  }
};
struct MeanFinish {
  float* mean;
  float inv_n;
  __device__ void operator()(int64_t c, const float (&s)[1]) const { mean[c] = s[0] * inv_n; }
};
struct VarFinish {
  const float* mean;
  float* rstd;
  float* running_mean;
  float* running_var;
  float inv_n, n, eps, momentum;
  __device__ void operator()(int64_t c, const float (&s)[1]) const {
    const float var = s[0] * inv_n;
    rstd[c] = norm::rstd_from_var(var, eps);
    running_mean[c] = bn::running_update(running_mean[c], mean[c], momentum);
    running_var[c] = bn::running_update(running_var[c], bn::unbiased_var(var, n), momentum);
  }
};
template <typename T>
struct GradTerm {  // v = {dy, dy * xhat}
  const T* dy;
  const T* x;
  const float* mean;
  const float* rstd;
  int64_t C;
  __device__ void operator()(int64_t n, int64_t c, float (&v)[2]) const {
    const float d = to_float(dy[n * C + c]);
    v[0] = d;
    v[1] = d * ((to_float(x[n * C + c]) - mean[c]) * rstd[c]);
  }
};
template <typename W>
struct GradFinish {
  const W* gamma;
  float* dgamma;
  float* dbeta;
  float* mdn;   // mean(dy) * gamma
  float* mdnx;  // mean(dy * xhat) * gamma
  float inv_n;
  __device__ void operator()(int64_t c, const float (&s)[2]) const {
    dgamma[c] += s[1];
    dbeta[c] += s[0];
    mdn[c] = s[0] * inv_n * to_float(gamma[c]);
    mdnx[c] = s[1] * inv_n * to_float(gamma[c]);
  }
};

__global__ void rstd_kernel(const float* var, float eps, float* rstd, int64_t C) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c < C) rstd[c] = norm::rstd_from_var(var[c], eps);
}

template <typename T, typename W>
__global__ void normalize_kernel(const T* x, const float* mean, const float* rstd, const W* gamma, const W* beta,
                                 T* y, int64_t N, int64_t C) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  gpu::RowColCursor at(first, stride, C);
  for (int64_t i = first; i < N * C; i += stride, at.advance()) {
    const int64_t c = at.col;
    y[i] = from_float<T>(norm::normalize(to_float(x[i]), mean[c], rstd[c], to_float(gamma[c]), to_float(beta[c])));
  }
}

template <typename T, typename W>
__global__ void dx_kernel(const T* dy, const T* x, const W* gamma, const float* mean, const float* rstd,
                          const float* mdn, const float* mdnx, T* dx, int64_t N, int64_t C) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  gpu::RowColCursor at(first, stride, C);
  for (int64_t i = first; i < N * C; i += stride, at.advance()) {
    const int64_t c = at.col;
    const float xhat = (to_float(x[i]) - mean[c]) * rstd[c];
    dx[i] = from_float<T>(norm::dx(norm::scaled_grad(to_float(dy[i]), to_float(gamma[c])), xhat, rstd[c], mdn[c], mdnx[c]));
  }
}

// Calls f(T{}, W{}) for x's storage type T and gamma's W (T or float).
template <typename F>
void dispatch_xw(const Tensor& x, const Tensor& gamma, const char* op, F&& f) {
  dispatch_float(x.dtype(), op, [&](auto xt) {
    using T = decltype(xt);
    if (gamma.dtype() == DType::f32) f(T{}, float{});
    else f(T{}, T{});
  });
}

}  // namespace

void batchnorm_forward_train(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps, float momentum,
                             Tensor& running_mean, Tensor& running_var, Tensor& y, Tensor& save_mean,
                             Tensor& save_rstd) {
  const int64_t N = x.dim(0), C = x.dim(1);
  const cudaStream_t s = gpu::stream_of(x);
  Tensor partial = Tensor::empty(x.device(), {gpu::col_sum_workspace(N, C, 1)}, DType::f32, Consumer::workspace);
  const float inv_n = 1.f / static_cast<float>(N);
  dispatch_xw(x, gamma, "batchnorm_forward_train", [&](auto xt, auto wt) {
    using T = decltype(xt);
    using W = decltype(wt);
    const T* xp = x.data_as<T>();
    float* mean = save_mean.data_as<float>();
    gpu::col_sums<1>(N, C, XTerm<T>{xp, C}, MeanFinish{mean, inv_n}, partial.data_as<float>(), s);
    gpu::col_sums<1>(N, C, SqTerm<T>{xp, mean, C},
                     VarFinish{mean, save_rstd.data_as<float>(), running_mean.data_as<float>(),
                               running_var.data_as<float>(), inv_n, static_cast<float>(N), eps, momentum},
                     partial.data_as<float>(), s);
    normalize_kernel<T, W><<<gpu::grid_for(N * C), gpu::kThreads, 0, s>>>(
        xp, mean, save_rstd.data_as<float>(), gamma.data_as<W>(), beta.data_as<W>(), y.data_as<T>(), N, C);
    HR_CUDA_CHECK_LAUNCH();
  });
}

void batchnorm_forward_eval(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps,
                            const Tensor& running_mean, const Tensor& running_var, Tensor& y) {
  const int64_t N = x.dim(0), C = x.dim(1);
  const cudaStream_t s = gpu::stream_of(x);
  Tensor rstd = Tensor::empty(x.device(), {C}, DType::f32, Consumer::workspace);
  rstd_kernel<<<gpu::grid_for(C), gpu::kThreads, 0, s>>>(running_var.data_as<float>(), eps, rstd.data_as<float>(), C);
  HR_CUDA_CHECK_LAUNCH();
  dispatch_xw(x, gamma, "batchnorm_forward_eval", [&](auto xt, auto wt) {
    using T = decltype(xt);
    using W = decltype(wt);
    normalize_kernel<T, W><<<gpu::grid_for(N * C), gpu::kThreads, 0, s>>>(
        x.data_as<T>(), running_mean.data_as<float>(), rstd.data_as<float>(), gamma.data_as<W>(), beta.data_as<W>(),
        y.data_as<T>(), N, C);
    HR_CUDA_CHECK_LAUNCH();
  });
}

void batchnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& save_mean,
                        const Tensor& save_rstd, Tensor& dx, Tensor& dgamma, Tensor& dbeta) {
  const int64_t N = x.dim(0), C = x.dim(1);
  const cudaStream_t s = gpu::stream_of(x);
  Tensor partial = Tensor::empty(x.device(), {gpu::col_sum_workspace(N, C, 2)}, DType::f32, Consumer::workspace);
  Tensor means = Tensor::empty(x.device(), {2, C}, DType::f32, Consumer::workspace);
  float* mdn = means.data_as<float>();
  float* mdnx = mdn + C;
  dispatch_xw(x, gamma, "batchnorm_backward", [&](auto xt, auto wt) {
    using T = decltype(xt);
    using W = decltype(wt);
    const float* mean = save_mean.data_as<float>();
    const float* rstd = save_rstd.data_as<float>();
    gpu::col_sums<2>(N, C, GradTerm<T>{dy.data_as<T>(), x.data_as<T>(), mean, rstd, C},
                     GradFinish<W>{gamma.data_as<W>(), dgamma.data_as<float>(), dbeta.data_as<float>(), mdn, mdnx,
                                   1.f / static_cast<float>(N)},
                     partial.data_as<float>(), s);
    dx_kernel<T, W><<<gpu::grid_for(N * C), gpu::kThreads, 0, s>>>(dy.data_as<T>(), x.data_as<T>(), gamma.data_as<W>(),
                                                                    mean, rstd, mdn, mdnx, dx.data_as<T>(), N, C);
    HR_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace hr::ops::cuda
