// LayerNorm: argument checks, backend dispatch and the CPU loops. Row statistics
// accumulate in double on the CPU (8 partial sums added in a fixed order); the
// per-element math is layernorm_math.hpp's.
#include "kernels/layernorm/layernorm.hpp"

#include <initializer_list>
#include <type_traits>
#include <vector>

#include "harness/check.hpp"
#include "kernels/common/cpu_rows.hpp"
#include "kernels/common/dispatch.hpp"
#include "kernels/common/dtype_dispatch.hpp"
#include "kernels/common/op_fault.hpp"
#include "kernels/common/widen.hpp"
#include "kernels/layernorm/layernorm_math.hpp"
#if HEADROOM_HAVE_CUDA
#include "kernels/layernorm/layernorm_cuda.hpp"
#endif

namespace hr::ops {
namespace {

// gamma, beta: [C], the dtype of x or fp32 (fp32 master weights with 16-bit activations).
void check_affine(const Tensor& x, const Tensor& p, int64_t C, const char* op, const char* name) {
  HR_CHECK(p.defined() && p.numel() == C && p.ndim() == 1, "{}: {} must be [{}], got {}", op, name, C, p.str());
  HR_CHECK(p.dtype() == x.dtype() || p.dtype() == DType::f32, "{}: {} must be {} or fp32, got {}", op, name,
           dtype_name(x.dtype()), p.str());
  check_same_device(x, p, op);
}

void check_f32(const Tensor& x, const Tensor& t, int64_t n, const char* op, const char* name) {
  HR_CHECK(t.defined() && t.dtype() == DType::f32 && t.numel() == n, "{}: {} must be fp32 with {} elements, got {}",
           op, name, n, t.str());
  check_same_device(x, t, op);
}

// The row statistics are cpu_rows.hpp's double sums in 8 lanes (a running double
// sum is one add's latency per element, and LayerNorm was 5.6% of the quick
// transformer's CPU step that way); the element loops are independent per element.
template <typename T>
void forward_cpu(const Tensor& x, const std::vector<float>& g, const std::vector<float>& b, float eps, Tensor& y,
                 Tensor& mean, Tensor& rstd) {
  const int64_t C = x.dim(-1), N = x.numel() / C;
  const T* xp = x.data_as<T>();
  T* yp = y.data_as<T>();
  float* mp = mean.data_as<float>();
  float* rp = rstd.data_as<float>();
  float* buf = std::is_same_v<T, float> ? nullptr : rows::row_buffer(C);  // a 16-bit row widened
  for (int64_t n = 0; n < N; ++n) {
    const float* xr = floats_of(xp + n * C, C, buf);
    const float m = static_cast<float>(rows::sum(xr, C) / static_cast<double>(C));
    const double v = rows::sum_sq_dev(xr, C, m);
    const float r = norm::rstd_from_var(static_cast<float>(v / static_cast<double>(C)), eps);
    mp[n] = m;
    rp[n] = r;
    T* yr = yp + n * C;
    for (int64_t c = 0; c < C; ++c) yr[c] = from_float<T>(norm::normalize(xr[c], m, r, g[c], b[c]));
  }
}

template <typename T>
void backward_cpu(const Tensor& dy, const Tensor& x, const std::vector<float>& g, const Tensor& mean,
                  const Tensor& rstd, Tensor& dx, Tensor& dgamma, Tensor& dbeta) {
  const int64_t C = x.dim(-1), N = x.numel() / C;
  const T* xp = x.data_as<T>();
  const T* dyp = dy.data_as<T>();
  T* dxp = dx.data_as<T>();
  const float* mp = mean.data_as<float>();
  const float* rp = rstd.data_as<float>();
  std::vector<double> dg(static_cast<size_t>(C), 0.0), db(static_cast<size_t>(C), 0.0);
  // xhat and dn = dy * gamma, and 16-bit rows of x and dy widened.
  float* buf = rows::row_buffer((std::is_same_v<T, float> ? 2 : 4) * C);
  float *xhat = buf, *dn = buf + C;
  float* xw = std::is_same_v<T, float> ? nullptr : buf + 2 * C;
  float* dyw = std::is_same_v<T, float> ? nullptr : buf + 3 * C;
  for (int64_t n = 0; n < N; ++n) {
    const int64_t o = n * C;
    const float* xr = floats_of(xp + o, C, xw);
    const float* d = floats_of(dyp + o, C, dyw);
    const float m = mp[n], r = rp[n];
    for (int64_t c = 0; c < C; ++c) {
      xhat[c] = (xr[c] - m) * r;
      dn[c] = norm::scaled_grad(d[c], g[c]);
    }
    const float mdn = static_cast<float>(rows::sum(dn, C) / static_cast<double>(C));
    const float mdnx = static_cast<float>(rows::dot(dn, xhat, C) / static_cast<double>(C));
    for (int64_t c = 0; c < C; ++c) {
      dg[c] += static_cast<double>(d[c] * xhat[c]);
      db[c] += d[c];
    }
    T* dxr = dxp + o;
    for (int64_t c = 0; c < C; ++c) dxr[c] = from_float<T>(norm::dx(dn[c], xhat[c], r, mdn, mdnx));
  }
  float* dgp = dgamma.data_as<float>();
  float* dbp = dbeta.data_as<float>();
  for (int64_t c = 0; c < C; ++c) {
    dgp[c] += static_cast<float>(dg[c]);
    dbp[c] += static_cast<float>(db[c]);
  }
}

}  // namespace

static void layernorm_forward_computed(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps,
                                       Tensor& y, Tensor& mean, Tensor& rstd) {
  const char* op = "layernorm_forward";
  HR_CHECK(x.defined() && x.ndim() >= 1 && x.numel() > 0 && is_float(x.dtype()), "{}: bad x {}", op, x.str());
  const int64_t C = x.dim(-1), N = x.numel() / C;
  check_affine(x, gamma, C, op, "gamma");
  check_affine(x, beta, C, op, "beta");
  // The GPU kernels read gamma and beta as one weight type, taken from gamma.
  HR_CHECK(beta.dtype() == gamma.dtype(), "{}: gamma {} and beta {} must share a dtype", op, gamma.str(), beta.str());
  check_same_shape(x, y, op);
  check_same_device(x, y, op);
  HR_CHECK(y.dtype() == x.dtype(), "{}: y {} must have the dtype of x {}", op, y.str(), x.str());
  check_f32(x, mean, N, op, "mean");
  check_f32(x, rstd, N, op, "rstd");
  HR_CHECK(eps >= 0.f, "{}: eps {} < 0", op, eps);
  HR_IF_CUDA(x, cuda::layernorm_forward(x, gamma, beta, eps, y, mean, rstd));
  const std::vector<float> g = gamma.cpu_values_f32(), b = beta.cpu_values_f32();
  dispatch_float(x.dtype(), op, [&](auto tag) { forward_cpu<decltype(tag)>(x, g, b, eps, y, mean, rstd); });
}

void layernorm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps, Tensor& y,
                       Tensor& mean, Tensor& rstd) {
  const OpTimer timer(x, __func__);
  layernorm_forward_computed(x, gamma, beta, eps, y, mean, rstd);
  apply_output_fault("layernorm_forward", y);
}

void layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& mean,
                        const Tensor& rstd, Tensor& dx, Tensor& dgamma, Tensor& dbeta) {
  const char* op = "layernorm_backward";
  HR_CHECK(x.defined() && x.ndim() >= 1 && x.numel() > 0 && is_float(x.dtype()), "{}: bad x {}", op, x.str());
  const int64_t C = x.dim(-1), N = x.numel() / C;
  check_affine(x, gamma, C, op, "gamma");
  for (const Tensor* t : std::initializer_list<const Tensor*>{&dy, &dx}) {
    check_same_shape(x, *t, op);
    check_same_device(x, *t, op);
    HR_CHECK(t->dtype() == x.dtype(), "{}: {} must have the dtype of x {}", op, t->str(), x.str());
  }
  check_f32(x, mean, N, op, "mean");
  check_f32(x, rstd, N, op, "rstd");
  check_f32(x, dgamma, C, op, "dgamma");
  check_f32(x, dbeta, C, op, "dbeta");
  HR_IF_CUDA(x, cuda::layernorm_backward(dy, x, gamma, mean, rstd, dx, dgamma, dbeta));
  const std::vector<float> g = gamma.cpu_values_f32();
  dispatch_float(x.dtype(), op,
                 [&](auto tag) { backward_cpu<decltype(tag)>(dy, x, g, mean, rstd, dx, dgamma, dbeta); });
}

}  // namespace hr::ops
