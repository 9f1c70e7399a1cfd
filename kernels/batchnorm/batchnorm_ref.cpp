// Float64 BatchNorm reference: textbook formulas, one channel at a time.
#include "kernels/batchnorm/batchnorm_ref.hpp"

#include <cmath>

namespace hr::ref {
namespace {
void channel_stats(const vecd& x, int64_t N, int64_t C, int64_t c, double& mean, double& var) {
  mean = 0;
  for (int64_t n = 0; n < N; ++n) mean += x[static_cast<size_t>(n * C + c)];
  mean /= static_cast<double>(N);
  var = 0;
  for (int64_t n = 0; n < N; ++n) {
    const double d = x[static_cast<size_t>(n * C + c)] - mean;
    var += d * d;
  }
  var /= static_cast<double>(N);
}
}  // namespace

void batchnorm_forward_train(const vecd& x, const vecd& gamma, const vecd& beta, int64_t N, int64_t C, double eps,
                             double momentum, vecd& running_mean, vecd& running_var, vecd& y) {
  y.assign(static_cast<size_t>(N * C), 0.0);
  for (int64_t c = 0; c < C; ++c) {
    double m, v;
    channel_stats(x, N, C, c, m, v);
    const double r = 1.0 / std::sqrt(v + eps);
    for (int64_t n = 0; n < N; ++n) {
      const size_t i = static_cast<size_t>(n * C + c);
      y[i] = (x[i] - m) * r * gamma[c] + beta[c];
    }
    running_mean[c] = (1 - momentum) * running_mean[c] + momentum * m;
    running_var[c] = (1 - momentum) * running_var[c] + momentum * v * N / (N - 1.0);
  }
}

void batchnorm_forward_eval(const vecd& x, const vecd& gamma, const vecd& beta, int64_t N, int64_t C, double eps,
                            const vecd& running_mean, const vecd& running_var, vecd& y) {
  y.assign(static_cast<size_t>(N * C), 0.0);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c) {
      const size_t i = static_cast<size_t>(n * C + c);
      y[i] = (x[i] - running_mean[c]) / std::sqrt(running_var[c] + eps) * gamma[c] + beta[c];
    }
}

void batchnorm_backward(const vecd& dy, const vecd& x, const vecd& gamma, int64_t N, int64_t C, double eps,
                        vecd& dx, vecd& dgamma, vecd& dbeta) {
  dx.assign(static_cast<size_t>(N * C), 0.0);
  dgamma.assign(static_cast<size_t>(C), 0.0);
  dbeta.assign(static_cast<size_t>(C), 0.0);
  for (int64_t c = 0; c < C; ++c) {
    double m, v;
    channel_stats(x, N, C, c, m, v);
    const double r = 1.0 / std::sqrt(v + eps);
    double sdy = 0, sdyx = 0;
    for (int64_t n = 0; n < N; ++n) {
      const size_t i = static_cast<size_t>(n * C + c);
      sdy += dy[i];
      sdyx += dy[i] * (x[i] - m) * r;
    }
    dgamma[c] = sdyx;
    dbeta[c] = sdy;
    for (int64_t n = 0; n < N; ++n) {
      const size_t i = static_cast<size_t>(n * C + c);
      const double xhat = (x[i] - m) * r;
      dx[i] = gamma[c] * r * (dy[i] - sdy / N - xhat * sdyx / N);
    }
  }
}

}  // namespace hr::ref
