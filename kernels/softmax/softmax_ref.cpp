// Float64 masked softmax reference: max, exponentials, normalisation, per row.
#include "kernels/softmax/softmax_ref.hpp"

#include <cmath>

namespace hr::ref {

bool softmax_allowed(const SoftmaxShape& sh, bool causal, const std::vector<int32_t>& key_valid_len,
                     const std::vector<int32_t>& segment_ids, int64_t b, int64_t t, int64_t s) {
  if (causal && s > t) return false;
  if (!key_valid_len.empty() && s >= key_valid_len[static_cast<size_t>(b)]) return false;
  if (!segment_ids.empty() &&
      segment_ids[static_cast<size_t>(b * sh.T + s)] != segment_ids[static_cast<size_t>(b * sh.T + t)])
    return false;
  return true;
}

void softmax_forward(const vecd& scores, const SoftmaxShape& sh, bool causal,
                     const std::vector<int32_t>& key_valid_len, const std::vector<int32_t>& segment_ids,
                     double scale, vecd& probs) {
  probs.assign(scores.size(), 0.0);
  for (int64_t b = 0; b < sh.B; ++b)
    for (int64_t h = 0; h < sh.H; ++h)
      for (int64_t t = 0; t < sh.T; ++t) {
        const size_t o = static_cast<size_t>(((b * sh.H + h) * sh.T + t) * sh.S);
        double mx = -INFINITY;
        for (int64_t s = 0; s < sh.S; ++s)
          if (softmax_allowed(sh, causal, key_valid_len, segment_ids, b, t, s))
            mx = std::fmax(mx, scale * scores[o + s]);
        if (mx == -INFINITY) continue;  // fully masked row: zeros
        double sum = 0;
        for (int64_t s = 0; s < sh.S; ++s)
          if (softmax_allowed(sh, causal, key_valid_len, segment_ids, b, t, s))
            sum += std::exp(scale * scores[o + s] - mx);
        for (int64_t s = 0; s < sh.S; ++s)
          if (softmax_allowed(sh, causal, key_valid_len, segment_ids, b, t, s))
            probs[o + s] = std::exp(scale * scores[o + s] - mx) / sum;
      }
}

void softmax_backward(const vecd& probs, const vecd& dprobs, const SoftmaxShape& sh, double scale, vecd& dscores) {
  dscores.assign(probs.size(), 0.0);
  const int64_t rows = sh.B * sh.H * sh.T;
  for (int64_t r = 0; r < rows; ++r) {
    const size_t o = static_cast<size_t>(r * sh.S);
    double dot = 0;
    for (int64_t s = 0; s < sh.S; ++s) dot += dprobs[o + s] * probs[o + s];
    for (int64_t s = 0; s < sh.S; ++s) dscores[o + s] = scale * probs[o + s] * (dprobs[o + s] - dot);
  }
}

}  // namespace hr::ref
