// Float64 cross-entropy reference: log-sum-exp per row, then the reduction.
#include "kernels/crossentropy/crossentropy_ref.hpp"

#include <cmath>

namespace hr::ref {
namespace {
double row_lse(const double* x, int64_t V) {
  double mx = -INFINITY;
  for (int64_t v = 0; v < V; ++v) mx = std::fmax(mx, x[v]);
  double s = 0;
  for (int64_t v = 0; v < V; ++v) s += std::exp(x[v] - mx);
  return mx + std::log(s);
}
// 1 / normaliser of the reduction (0 when a mean has no real token).
double weight(const std::vector<int32_t>& targets, const ops::CrossEntropyConfig& cfg) {
  double real = 0;
  for (int32_t t : targets) real += t != cfg.ignore_index;
  switch (cfg.reduction) {
    case ops::LossReduction::mean: return real > 0 ? 1.0 / real : 0.0;
    case ops::LossReduction::sum: return 1.0;
    case ops::LossReduction::sum_div_count: return 1.0 / cfg.count;
  }
  return 0;
}
}  // namespace

double cross_entropy_forward(const vecd& logits, const std::vector<int32_t>& targets, int64_t V,
                             const ops::CrossEntropyConfig& cfg, vecd& losses) {
  losses.assign(targets.size(), 0.0);
  double total = 0;
  for (size_t n = 0; n < targets.size(); ++n) {
    if (targets[n] == cfg.ignore_index) continue;
    const double* x = &logits[n * static_cast<size_t>(V)];
    losses[n] = row_lse(x, V) - x[targets[n]];
    total += losses[n];
  }
  return total * weight(targets, cfg);
}

void cross_entropy_backward(const vecd& logits, const std::vector<int32_t>& targets, int64_t V,
                            const ops::CrossEntropyConfig& cfg, vecd& dlogits) {
  dlogits.assign(logits.size(), 0.0);
  const double w = weight(targets, cfg) * cfg.loss_scale;
  for (size_t n = 0; n < targets.size(); ++n) {
    if (targets[n] == cfg.ignore_index) continue;
    const double* x = &logits[n * static_cast<size_t>(V)];
    const double lse = row_lse(x, V);
    for (int64_t v = 0; v < V; ++v)
      dlogits[n * V + v] = w * (std::exp(x[v] - lse) - (v == targets[n] ? 1.0 : 0.0));
  }
}

}  // namespace hr::ref
