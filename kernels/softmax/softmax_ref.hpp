// Float64 reference of the masked row softmax over [B, H, T, S], deliberately
// simple: the oracle of OPS-1 / OPS-2 and of the mask-semantics tests.
#pragma once

#include <cstdint>
#include <vector>

namespace hr::ref {

using vecd = std::vector<double>;

struct SoftmaxShape {
  int64_t B, H, T, S;
};

// key_valid_len [B] and segment_ids [B, T] may be empty (no such mask).
bool softmax_allowed(const SoftmaxShape& sh, bool causal, const std::vector<int32_t>& key_valid_len,
                     const std::vector<int32_t>& segment_ids, int64_t b, int64_t t, int64_t s);
void softmax_forward(const vecd& scores, const SoftmaxShape& sh, bool causal,
                     const std::vector<int32_t>& key_valid_len, const std::vector<int32_t>& segment_ids,
                     double scale, vecd& probs);
void softmax_backward(const vecd& probs, const vecd& dprobs, const SoftmaxShape& sh, double scale, vecd& dscores);

}  // namespace hr::ref
