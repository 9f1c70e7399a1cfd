// A float64 reference of the controlled MLP (harness/models/mlp.hpp): forward,
// loss, an analytic backward derived by hand from the definition, and the
// BatchNorm running statistics; host vectors, plain loops, none of headroom's ops.
// It is what the fp32 model is checked against, and its own backward is checked
// against its central finite differences.
//
// Conventions (those of mlp.hpp and the dump's conventions.json): weights [out, in],
// y = x W^T + b; each block but the last: linear -> [norm] -> GELU (tanh form),
// dropout off. LayerNorm normalises each row over its W features; BatchNorm each
// feature over a group of rows (the micro-batch, or each ghost virtual batch of it),
// both with the biased variance and rstd = 1 / sqrt(var + eps). BatchNorm's running
// statistics fold in each group in order: r = (1 - momentum) r + momentum s, with
// the unbiased variance for the running variance. Loss: the sum over items of
// (pred - target)^2 (regression) or -log softmax(pred)[class] (classification),
// divided by `count`.
//
// The conventions are parameters (RefMlpConventions) so that a test can run a
// reference with another convention as a negative control: a check that cannot
// tell the erf GELU from the tanh GELU, or eps inside the square root from eps
// outside it, would not be checking the model's conventions. RefMlpBackwardFault
// breaks the analytic backward only (for the finite-difference check's controls).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "harness/models/presets.hpp"

namespace hr::test {

using RefMlpParams = std::map<std::string, std::vector<double>>;

enum class RefGelu { tanh_form, erf_form, relu };

struct RefMlpConventions {
  RefGelu gelu = RefGelu::tanh_form;
  bool eps_inside_sqrt = true;             // rstd = 1 / sqrt(var + eps), else 1 / (sqrt(var) + eps)
  bool running_var_unbiased = true;        // running variance folds in var * n / (n - 1)
};

enum class RefMlpBackwardFault {
  none,
  gelu_drops_x_term,     // dGELU/dx taken as 0.5 (1 + tanh u): the x sech^2(u) u' term dropped
  gelu_erf_derivative,   // the derivative of the erf form under the tanh-form forward
  norm_stats_constant,   // the normalisation's mean and rstd treated as constants
  norm_drops_eps,        // d rstd / d var taken without eps (the forward keeps it)
};

struct RefMlpBatch {
  int64_t rows = 0;
  std::vector<double> x;        // [rows, in_dim]
  std::vector<double> targets;  // regression: [rows, out_dim]
  std::vector<int32_t> classes; // classification: [rows]
  // BatchNorm statistics are taken over consecutive groups of this many rows (a
  // micro-batch, or a ghost virtual batch inside one); 0 = all rows.
  int64_t bn_group_rows = 0;
  double count = 1;             // the loss normaliser
};

struct RefMlpResult {
  double loss = 0;
  RefMlpParams grads;                                   // same names and layouts as the parameters
  std::vector<std::vector<double>> running_mean, running_var;  // per block, after the pass
};

namespace ref_mlp_detail {

inline size_t at(int64_t i) { return static_cast<size_t>(i); }

constexpr double kSqrt2OverPi = 0.79788456080286535588;  // sqrt(2 / pi)
constexpr double kCubic = 0.044715;

inline double gelu(double x, RefGelu form) {
  switch (form) {
    case RefGelu::tanh_form: return 0.5 * x * (1.0 + std::tanh(kSqrt2OverPi * (x + kCubic * x * x * x)));
    case RefGelu::erf_form: return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0)));
    case RefGelu::relu: return x > 0 ? x : 0.0;
  }
  return 0;
}

// d/dx of gelu(x, form), differentiated by hand; `fault` breaks it on purpose.
inline double gelu_grad(double x, RefGelu form, RefMlpBackwardFault fault) {
  const double pi = 3.14159265358979323846;
  if (form == RefGelu::relu) return x > 0 ? 1.0 : 0.0;
  if (form == RefGelu::erf_form || fault == RefMlpBackwardFault::gelu_erf_derivative)
    return 0.5 * (1.0 + std::erf(x / std::sqrt(2.0))) + x * std::exp(-0.5 * x * x) / std::sqrt(2.0 * pi);
  // y = 0.5 x (1 + tanh u), u = c (x + k x^3): y' = 0.5 (1 + tanh u) + 0.5 x sech^2(u) u'.
  const double u = kSqrt2OverPi * (x + kCubic * x * x * x);
  const double t = std::tanh(u);
  const double du = kSqrt2OverPi * (1.0 + 3.0 * kCubic * x * x);
  if (fault == RefMlpBackwardFault::gelu_drops_x_term) return 0.5 * (1.0 + t);
  return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * du;
}

inline double rstd_of(double var, double eps, const RefMlpConventions& c) {
  return c.eps_inside_sqrt ? 1.0 / std::sqrt(var + eps) : 1.0 / (std::sqrt(var) + eps);
}
// d rstd / d var for the same convention.
inline double drstd_dvar(double var, double eps, const RefMlpConventions& c) {
  if (c.eps_inside_sqrt) return -0.5 * std::pow(var + eps, -1.5);
  const double s = std::sqrt(var);
  return -1.0 / ((s + eps) * (s + eps)) * (0.5 / s);
}

// One normalisation group: n values v[k * stride] (k < n) normalised together.
// Saved: mean, var, rstd for the backward pass.
struct NormGroup {
  int64_t offset, stride, n;
  double mean, var, rstd;
};

// Forward over a group: y = gamma * (x - mean) * rstd + beta, gamma / beta indexed by `feature`.
inline void norm_forward(const std::vector<double>& x, NormGroup& g, double eps, const RefMlpConventions& c,
                         const std::vector<double>& gamma, const std::vector<double>& beta, bool per_feature_gamma,
                         int64_t feature, std::vector<double>& y) {
  double mean = 0, var = 0;
  for (int64_t k = 0; k < g.n; ++k) mean += x[at(g.offset + k * g.stride)];
  mean /= static_cast<double>(g.n);
  for (int64_t k = 0; k < g.n; ++k) {
    const double d = x[at(g.offset + k * g.stride)] - mean;
    var += d * d;
  }
  var /= static_cast<double>(g.n);  // biased: the normalisation's variance
  g.mean = mean;
  g.var = var;
  g.rstd = rstd_of(var, eps, c);
  for (int64_t k = 0; k < g.n; ++k) {
    const int64_t idx = g.offset + k * g.stride;
    const int64_t f = per_feature_gamma ? k : feature;  // LayerNorm: k runs over features
    y[at(idx)] = gamma[at(f)] * (x[at(idx)] - mean) * g.rstd + beta[at(f)];
  }
}

// Backward over a group by the chain rule through mean and var:
//   dxhat_k = dy_k gamma;  dvar = sum_k dxhat_k (x_k - mean) drstd/dvar;
//   dmean = -rstd sum_k dxhat_k  (var's dependence on mean sums to zero);
//   dx_k = rstd dxhat_k + dmean / n + dvar 2 (x_k - mean) / n.
inline void norm_backward(const std::vector<double>& x, const NormGroup& g, double eps, const RefMlpConventions& c,
                          const std::vector<double>& gamma, bool per_feature_gamma, int64_t feature,
                          const std::vector<double>& dy, RefMlpBackwardFault fault, std::vector<double>& dx,
                          std::vector<double>& dgamma, std::vector<double>& dbeta) {
  double sum_dxhat = 0, sum_dxhat_xc = 0;
  for (int64_t k = 0; k < g.n; ++k) {
    const int64_t idx = g.offset + k * g.stride;
    const int64_t f = per_feature_gamma ? k : feature;
    const double xc = x[at(idx)] - g.mean;
    dgamma[at(f)] += dy[at(idx)] * xc * g.rstd;
    dbeta[at(f)] += dy[at(idx)];
    const double dxhat = dy[at(idx)] * gamma[at(f)];
    sum_dxhat += dxhat;
    sum_dxhat_xc += dxhat * xc;
  }
  const bool constant_stats = fault == RefMlpBackwardFault::norm_stats_constant;
  const double eps_b = fault == RefMlpBackwardFault::norm_drops_eps ? 0.0 : eps;
  const double dvar = constant_stats ? 0.0 : sum_dxhat_xc * drstd_dvar(g.var, eps_b, c);
  const double dmean = constant_stats ? 0.0 : -g.rstd * sum_dxhat;
  const double n = static_cast<double>(g.n);
  for (int64_t k = 0; k < g.n; ++k) {
    const int64_t idx = g.offset + k * g.stride;
    const int64_t f = per_feature_gamma ? k : feature;
    dx[at(idx)] = g.rstd * dy[at(idx)] * gamma[at(f)] + dmean / n + dvar * 2.0 * (x[at(idx)] - g.mean) / n;
  }
}

}  // namespace ref_mlp_detail

// One forward (and, with `backward`, backward) pass of the whole batch. `running`
// starts from the model's initial running statistics (mean 0, variance 1).
inline RefMlpResult ref_mlp_pass(const MlpConfig& cfg, const RefMlpParams& p, const RefMlpBatch& batch,
                                 bool backward, const RefMlpConventions& conv = {},
                                 RefMlpBackwardFault fault = RefMlpBackwardFault::none) {
  using namespace ref_mlp_detail;
  const int64_t N = batch.rows, W = cfg.width, L = cfg.layers;
  const double eps = cfg.norm_eps, momentum = cfg.bn_momentum;
  auto P = [&](const std::string& n) -> const std::vector<double>& { return p.at(n); };
  auto lname = [](const char* what, int64_t l, const char* leaf) {
    return std::string(what) + "." + std::to_string(l) + "." + leaf;
  };
  RefMlpResult r;

  // Forward, keeping every block's input, linear output, norm groups and GELU input.
  std::vector<std::vector<double>> xs(at(L)), hs(at(L)), acts(at(L));
  std::vector<std::vector<NormGroup>> groups(at(L));
  xs[0] = batch.x;
  const int64_t group_rows = batch.bn_group_rows > 0 ? batch.bn_group_rows : N;
  for (int64_t l = 0; l < L; ++l) {
    const int64_t in = l == 0 ? cfg.in_dim : W, out = l + 1 == L ? cfg.out_dim : W;
    const auto& w = P(lname("layers", l, "weight"));
    const auto& b = P(lname("layers", l, "bias"));
    auto& h = hs[at(l)];
    h.assign(at(N * out), 0.0);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t o = 0; o < out; ++o) {
        double acc = b[at(o)];
        for (int64_t i = 0; i < in; ++i) acc += xs[at(l)][at(n * in + i)] * w[at(o * in + i)];
        h[at(n * out + o)] = acc;
      }
    if (l + 1 == L) break;
    auto& a = acts[at(l)];  // the GELU's input
    a = h;
    if (cfg.norm == NormKind::layernorm) {
      for (int64_t n = 0; n < N; ++n) groups[at(l)].push_back({n * W, 1, W, 0, 0, 0});
    } else if (cfg.norm == NormKind::batchnorm) {
      for (int64_t g0 = 0; g0 < N; g0 += group_rows)
        for (int64_t f = 0; f < W; ++f) groups[at(l)].push_back({g0 * W + f, W, group_rows, 0, 0, 0});
    }
    if (cfg.norm != NormKind::none) {
      const auto& gamma = P(lname("norms", l, "weight"));
      const auto& beta = P(lname("norms", l, "bias"));
      const bool ln = cfg.norm == NormKind::layernorm;
      for (auto& g : groups[at(l)]) norm_forward(h, g, eps, conv, gamma, beta, ln, g.offset % W, a);
    }
    if (cfg.norm == NormKind::batchnorm) {
      // Groups were pushed group-major, feature-minor: fold them in in row order.
      std::vector<double> rm(at(W), 0.0), rv(at(W), 1.0);
      for (const auto& g : groups[at(l)]) {
        const int64_t f = g.offset % W;
        const double nn = static_cast<double>(g.n);
        const double batch_var = conv.running_var_unbiased ? g.var * nn / (nn - 1.0) : g.var;
        rm[at(f)] = (1.0 - momentum) * rm[at(f)] + momentum * g.mean;
        rv[at(f)] = (1.0 - momentum) * rv[at(f)] + momentum * batch_var;
      }
      r.running_mean.push_back(rm);
      r.running_var.push_back(rv);
    }
    auto& next = xs[at(l + 1)];
    next.resize(a.size());
    for (size_t k = 0; k < a.size(); ++k) next[k] = gelu(a[k], conv.gelu);
  }

  // Loss and its gradient with respect to the prediction.
  const int64_t O = cfg.out_dim;
  const auto& pred = hs[at(L - 1)];
  std::vector<double> dh(pred.size(), 0.0);
  double loss = 0;
  for (int64_t n = 0; n < N; ++n) {
    if (cfg.task == MlpTask::regression) {
      for (int64_t o = 0; o < O; ++o) {
        const double d = pred[at(n * O + o)] - batch.targets[at(n * O + o)];
        loss += d * d;
        dh[at(n * O + o)] = 2.0 * d / batch.count;
      }
    } else {
      double mx = -INFINITY;
      for (int64_t o = 0; o < O; ++o) mx = std::max(mx, pred[at(n * O + o)]);
      double z = 0;
      for (int64_t o = 0; o < O; ++o) z += std::exp(pred[at(n * O + o)] - mx);
      const int32_t c = batch.classes[at(n)];
      loss += std::log(z) + mx - pred[at(n * O + c)];
      for (int64_t o = 0; o < O; ++o)
        dh[at(n * O + o)] = (std::exp(pred[at(n * O + o)] - mx) / z - (o == c ? 1.0 : 0.0)) / batch.count;
    }
  }
  r.loss = loss / batch.count;
  if (!backward) return r;

  // Backward, last layer first; dh is d loss / d (linear output of layer l).
  for (int64_t l = L - 1; l >= 0; --l) {
    const int64_t in = l == 0 ? cfg.in_dim : W, out = l + 1 == L ? cfg.out_dim : W;
    const auto& w = P(lname("layers", l, "weight"));
    auto& dw = r.grads[lname("layers", l, "weight")];
    auto& db = r.grads[lname("layers", l, "bias")];
    dw.assign(at(out * in), 0.0);
    db.assign(at(out), 0.0);
    std::vector<double> dx(at(N * in), 0.0);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t o = 0; o < out; ++o) {
        const double d = dh[at(n * out + o)];
        db[at(o)] += d;
        for (int64_t i = 0; i < in; ++i) {
          dw[at(o * in + i)] += d * xs[at(l)][at(n * in + i)];
          dx[at(n * in + i)] += d * w[at(o * in + i)];
        }
      }
    if (l == 0) break;
    // dx is d loss / d (output of block l - 1): back through its GELU and norm.
    const int64_t b = l - 1;
    const auto& a = acts[at(b)];
    std::vector<double> da(a.size());
    for (size_t k = 0; k < a.size(); ++k) da[k] = dx[k] * gelu_grad(a[k], conv.gelu, fault);
    if (cfg.norm == NormKind::none) {
      dh = std::move(da);
      continue;
    }
    const auto& gamma = P(lname("norms", b, "weight"));
    auto& dgamma = r.grads[lname("norms", b, "weight")];
    auto& dbeta = r.grads[lname("norms", b, "bias")];
    dgamma.assign(at(W), 0.0);
    dbeta.assign(at(W), 0.0);
    dh.assign(a.size(), 0.0);
    const bool ln = cfg.norm == NormKind::layernorm;
    for (const auto& g : groups[at(b)])
      norm_backward(hs[at(b)], g, eps, conv, gamma, ln, g.offset % W, da, fault, dh, dgamma, dbeta);
  }
  return r;
}

inline double ref_mlp_loss(const MlpConfig& cfg, const RefMlpParams& p, const RefMlpBatch& batch,
                           const RefMlpConventions& conv = {}) {
  return ref_mlp_pass(cfg, p, batch, false, conv).loss;
}

}  // namespace hr::test
