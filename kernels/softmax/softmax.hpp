// Row softmax over the last dimension of scores [B, H, T, S] with attention masks.
// A masked position gets probability exactly 0; a row with every position masked
// gives all zeros (not NaN).
#pragma once

#include "harness/tensor.hpp"

namespace hr::ops {

// Which key positions s a query position t of batch row b may attend to. All
// conditions combine (logical and). Tensors are int32 and may be undefined.
struct AttnMask {
  bool causal = true;       // s <= t (with T == S)
  Tensor key_valid_len;     // [B]: s < key_valid_len[b] (padding)
  Tensor segment_ids;       // [B, T]: segment_ids[b, s] == segment_ids[b, t] (packing)
};

void softmax_forward(const Tensor& scores, const AttnMask& mask, float scale, Tensor& probs);  // softmax(scale * x)
// dscores = scale * probs * (dprobs - sum_s(dprobs * probs)); overwritten.
void softmax_backward(const Tensor& probs, const Tensor& dprobs, float scale, Tensor& dscores);

}  // namespace hr::ops
