// Float64 reference of the attention core, deliberately simple: scores by a triple
// loop, the masked softmax reference of kernels/softmax, then the weighted sum.
// The oracle of OPS-1 and, by finite differences, of OPS-2.
#pragma once

#include <cstdint>
#include <vector>

namespace hr::ref {

struct AttentionShape {
  int64_t B, H, T, D;
};

// q, k, v [B, H, T, D]; key_valid_len [B] and segment_ids [B, T] may be empty.
std::vector<double> attention_forward(const std::vector<double>& q, const std::vector<double>& k,
                                      const std::vector<double>& v, const AttentionShape& sh, bool causal,
                                      const std::vector<int32_t>& key_valid_len,
                                      const std::vector<int32_t>& segment_ids, double scale);

}  // namespace hr::ref
