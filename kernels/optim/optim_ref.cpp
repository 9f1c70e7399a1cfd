// Float64 references of SGD and AdamW (see optim_ref.hpp).
#include "kernels/optim/optim_ref.hpp"

#include <cmath>

#include "harness/check.hpp"

namespace hr::ref {

void sgd_step(OptimState& s, const std::vector<double>& grad, double lr, double momentum, double weight_decay) {
  HR_CHECK(grad.size() == s.param.size(), "ref::sgd_step sizes {} vs {}", grad.size(), s.param.size());
  s.buf1.resize(s.param.size(), 0.0);
  for (size_t i = 0; i < grad.size(); ++i) {
    double d = grad[i] + weight_decay * s.param[i];
    if (momentum != 0.0) {
      s.buf1[i] = momentum * s.buf1[i] + d;
      d = s.buf1[i];
    }
    s.param[i] -= lr * d;
  }
}

void adamw_step(OptimState& s, const std::vector<double>& grad, int64_t step, double lr, double beta1, double beta2,
                double eps, double weight_decay) {
  HR_CHECK(grad.size() == s.param.size(), "ref::adamw_step sizes {} vs {}", grad.size(), s.param.size());
  s.buf1.resize(s.param.size(), 0.0);
  s.buf2.resize(s.param.size(), 0.0);
  const double bc1 = 1.0 - std::pow(beta1, static_cast<double>(step));
  const double bc2 = 1.0 - std::pow(beta2, static_cast<double>(step));
  for (size_t i = 0; i < grad.size(); ++i) {
    s.param[i] *= 1.0 - lr * weight_decay;
    s.buf1[i] = beta1 * s.buf1[i] + (1.0 - beta1) * grad[i];
    s.buf2[i] = beta2 * s.buf2[i] + (1.0 - beta2) * grad[i] * grad[i];
    const double m_hat = s.buf1[i] / bc1, v_hat = s.buf2[i] / bc2;
    s.param[i] -= lr * m_hat / (std::sqrt(v_hat) + eps);
  }
}

}  // namespace hr::ref
