// Float64 attention reference (see attention_ref.hpp).
#include "kernels/attention/attention_ref.hpp"

#include "kernels/matmul/matmul_ref.hpp"
#include "kernels/softmax/softmax_ref.hpp"

namespace hr::ref {

std::vector<double> attention_forward(const std::vector<double>& q, const std::vector<double>& k,
                                      const std::vector<double>& v, const AttentionShape& sh, bool causal,
                                      const std::vector<int32_t>& key_valid_len,
                                      const std::vector<int32_t>& segment_ids, double scale) {
  const int64_t bh = sh.B * sh.H;
  const std::vector<double> scores =
      matmul(q, false, k, true, std::vector<double>(bh * sh.T * sh.T), bh, sh.T, sh.T, sh.D);
  std::vector<double> probs;
  softmax_forward(scores, SoftmaxShape{sh.B, sh.H, sh.T, sh.T}, causal, key_valid_len, segment_ids, scale, probs);
  return matmul(probs, false, v, false, std::vector<double>(bh * sh.T * sh.D), bh, sh.T, sh.D, sh.T);
}

}  // namespace hr::ref
