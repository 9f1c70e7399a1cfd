// Float64 LayerNorm reference: textbook formulas, two passes per row.
#include "kernels/layernorm/layernorm_ref.hpp"

#include <cmath>

namespace hr::ref {

void layernorm_forward(const vecd& x, const vecd& gamma, const vecd& beta, int64_t N, int64_t C, double eps,
                       vecd& y, vecd& mean, vecd& rstd) {
  y.assign(static_cast<size_t>(N * C), 0.0);
  mean.assign(static_cast<size_t>(N), 0.0);
  rstd.assign(static_cast<size_t>(N), 0.0);
  for (int64_t n = 0; n < N; ++n) {
    const double* xr = &x[static_cast<size_t>(n * C)];
    double m = 0;
    for (int64_t c = 0; c < C; ++c) m += xr[c];
    m /= static_cast<double>(C);
    double v = 0;
    for (int64_t c = 0; c < C; ++c) v += (xr[c] - m) * (xr[c] - m);
    v /= static_cast<double>(C);
    const double r = 1.0 / std::sqrt(v + eps);
    mean[static_cast<size_t>(n)] = m;
    rstd[static_cast<size_t>(n)] = r;
    for (int64_t c = 0; c < C; ++c) y[static_cast<size_t>(n * C + c)] = (xr[c] - m) * r * gamma[c] + beta[c];
  }
}

void layernorm_backward(const vecd& dy, const vecd& x, const vecd& gamma, int64_t N, int64_t C, double eps,
                        vecd& dx, vecd& dgamma, vecd& dbeta) {
  vecd y, mean, rstd;
  layernorm_forward(x, gamma, vecd(static_cast<size_t>(C), 0.0), N, C, eps, y, mean, rstd);
  dx.assign(static_cast<size_t>(N * C), 0.0);
  dgamma.assign(static_cast<size_t>(C), 0.0);
  dbeta.assign(static_cast<size_t>(C), 0.0);
  for (int64_t n = 0; n < N; ++n) {
    const size_t o = static_cast<size_t>(n * C);
    double mdn = 0, mdnx = 0;
    for (int64_t c = 0; c < C; ++c) {
      const double xhat = (x[o + c] - mean[n]) * rstd[n];
      const double dn = dy[o + c] * gamma[c];
      mdn += dn;
      mdnx += dn * xhat;
      dgamma[c] += dy[o + c] * xhat;
      dbeta[c] += dy[o + c];
    }
    mdn /= static_cast<double>(C);
    mdnx /= static_cast<double>(C);
    for (int64_t c = 0; c < C; ++c) {
      const double xhat = (x[o + c] - mean[n]) * rstd[n];
      dx[o + c] = rstd[n] * (dy[o + c] * gamma[c] - mdn - xhat * mdnx);
    }
  }
}

}  // namespace hr::ref
