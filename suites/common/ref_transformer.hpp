// A float64 reference of the controlled transformer's forward pass and loss
// (host vectors, deliberately plain loops): the target of the model-level
// finite-difference check. It reads the same parameter names and layout as
// harness/models/transformer.hpp and implements the same conventions: pre-LN
// blocks, tanh GELU, attention scale 1/sqrt(D), causal + padding + packing mask,
// cross-entropy over targets != ignore_index, summed and divided by `count`.
// Dropout is not modelled (use p = 0).
#pragma once

#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "harness/models/presets.hpp"

namespace hr::test {

using RefParams = std::map<std::string, std::vector<double>>;

struct RefLmBatch {
  int64_t B = 0, T = 0;
  std::vector<int32_t> ids, pos, targets;  // [B*T]
  std::vector<int32_t> key_valid_len;      // [B] or empty
  std::vector<int32_t> segment_ids;        // [B*T] or empty
};

namespace ref_detail {

inline void layernorm(const std::vector<double>& x, int64_t N, int64_t C, const std::vector<double>& g,
                      const std::vector<double>& b, double eps, std::vector<double>& y) {
  y.assign(static_cast<size_t>(N * C), 0.0);
  for (int64_t n = 0; n < N; ++n) {
    double mean = 0, var = 0;
    for (int64_t c = 0; c < C; ++c) mean += x[static_cast<size_t>(n * C + c)];
    mean /= static_cast<double>(C);
    for (int64_t c = 0; c < C; ++c) {
      const double d = x[static_cast<size_t>(n * C + c)] - mean;
      var += d * d;
    }
    var /= static_cast<double>(C);
    const double rstd = 1.0 / std::sqrt(var + eps);
    for (int64_t c = 0; c < C; ++c)
      y[static_cast<size_t>(n * C + c)] =
          (x[static_cast<size_t>(n * C + c)] - mean) * rstd * g[static_cast<size_t>(c)] + b[static_cast<size_t>(c)];
  }
}

// y [N, out] = x [N, in] w^T [in, out] + b (b may be empty).
inline void linear(const std::vector<double>& x, int64_t N, int64_t in, const std::vector<double>& w, int64_t out,
                   const std::vector<double>* b, std::vector<double>& y) {
  y.assign(static_cast<size_t>(N * out), 0.0);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < out; ++o) {
      double acc = b ? (*b)[static_cast<size_t>(o)] : 0.0;
      for (int64_t i = 0; i < in; ++i)
        acc += x[static_cast<size_t>(n * in + i)] * w[static_cast<size_t>(o * in + i)];
      y[static_cast<size_t>(n * out + o)] = acc;
    }
}

inline double gelu(double x) {
  return 0.5 * x * (1.0 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
}

}  // namespace ref_detail

// Returns sum over real targets of -log softmax(logits)[target], divided by count.
inline double ref_transformer_loss(const TransformerConfig& cfg, const RefParams& p, const RefLmBatch& batch,
                                   double count) {
  using namespace ref_detail;
  const int64_t B = batch.B, T = batch.T, C = cfg.d_model, H = cfg.heads, D = C / H, N = B * T;
  const int64_t R = cfg.mlp_ratio * C, V = cfg.vocab;
  auto P = [&](const std::string& n) -> const std::vector<double>& { return p.at(n); };
  std::vector<double> x(static_cast<size_t>(N * C));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c)
      x[static_cast<size_t>(n * C + c)] = P("wte")[static_cast<size_t>(batch.ids[static_cast<size_t>(n)] * C + c)] +
                                          P("wpe")[static_cast<size_t>(batch.pos[static_cast<size_t>(n)] * C + c)];
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  for (int64_t l = 0; l < cfg.layers; ++l) {
    const std::string h = "h." + std::to_string(l) + ".";
    std::vector<double> ln, q, k, v;
    layernorm(x, N, C, P(h + "ln1.weight"), P(h + "ln1.bias"), cfg.ln_eps, ln);
    linear(ln, N, C, P(h + "attn.q.weight"), C, &P(h + "attn.q.bias"), q);
    linear(ln, N, C, P(h + "attn.k.weight"), C, &P(h + "attn.k.bias"), k);
    linear(ln, N, C, P(h + "attn.v.weight"), C, &P(h + "attn.v.bias"), v);
    std::vector<double> att(static_cast<size_t>(N * C), 0.0), w(static_cast<size_t>(T));
    for (int64_t b = 0; b < B; ++b)
      for (int64_t hd = 0; hd < H; ++hd)
        for (int64_t t = 0; t < T; ++t) {
          double mx = -INFINITY;
          for (int64_t s = 0; s < T; ++s) {
            bool ok = s <= t;
            if (!batch.key_valid_len.empty()) ok = ok && s < batch.key_valid_len[static_cast<size_t>(b)];
            if (!batch.segment_ids.empty())
              ok = ok && batch.segment_ids[static_cast<size_t>(b * T + s)] ==
                             batch.segment_ids[static_cast<size_t>(b * T + t)];
            if (!ok) {
              w[static_cast<size_t>(s)] = -INFINITY;
              continue;
            }
            double dotp = 0;
            for (int64_t d = 0; d < D; ++d)
              dotp += q[static_cast<size_t>((b * T + t) * C + hd * D + d)] *
                      k[static_cast<size_t>((b * T + s) * C + hd * D + d)];
            w[static_cast<size_t>(s)] = dotp * scale;
            mx = std::max(mx, w[static_cast<size_t>(s)]);
          }
          if (mx == -INFINITY) continue;  // every key masked: zeros
          double z = 0;
          for (int64_t s = 0; s < T; ++s) {
            w[static_cast<size_t>(s)] = w[static_cast<size_t>(s)] == -INFINITY ? 0.0 : std::exp(w[static_cast<size_t>(s)] - mx);
            z += w[static_cast<size_t>(s)];
          }
          for (int64_t d = 0; d < D; ++d) {
            double acc = 0;
            for (int64_t s = 0; s < T; ++s)
              acc += w[static_cast<size_t>(s)] / z * v[static_cast<size_t>((b * T + s) * C + hd * D + d)];
            att[static_cast<size_t>((b * T + t) * C + hd * D + d)] = acc;
          }
        }
    std::vector<double> proj;
    linear(att, N, C, P(h + "attn.proj.weight"), C, &P(h + "attn.proj.bias"), proj);
    for (size_t i = 0; i < x.size(); ++i) x[i] += proj[i];
    std::vector<double> ln2, fc, mo;
    layernorm(x, N, C, P(h + "ln2.weight"), P(h + "ln2.bias"), cfg.ln_eps, ln2);
    linear(ln2, N, C, P(h + "mlp.fc.weight"), R, &P(h + "mlp.fc.bias"), fc);
    for (double& e : fc) e = gelu(e);
    linear(fc, N, R, P(h + "mlp.proj.weight"), C, &P(h + "mlp.proj.bias"), mo);
    for (size_t i = 0; i < x.size(); ++i) x[i] += mo[i];
  }
  std::vector<double> lnf, logits;
  layernorm(x, N, C, P("ln_f.weight"), P("ln_f.bias"), cfg.ln_eps, lnf);
  linear(lnf, N, C, P("lm_head.weight"), V, nullptr, logits);
  double loss = 0;
  for (int64_t n = 0; n < N; ++n) {
    const int32_t tg = batch.targets[static_cast<size_t>(n)];
    if (tg == cfg.ignore_index) continue;
    double mx = -INFINITY;
    for (int64_t v2 = 0; v2 < V; ++v2) mx = std::max(mx, logits[static_cast<size_t>(n * V + v2)]);
    double z = 0;
    for (int64_t v2 = 0; v2 < V; ++v2) z += std::exp(logits[static_cast<size_t>(n * V + v2)] - mx);
    loss += std::log(z) + mx - logits[static_cast<size_t>(n * V + tg)];
  }
  return loss / count;
}

}  // namespace hr::test
