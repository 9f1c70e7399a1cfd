// Cross-entropy over logits [N, V] with int32 targets [N] and an ignore index,
// fused with the softmax. Three reductions:
// - mean:          sum over real tokens / number of real tokens in this call;
// - sum:           sum over real tokens;
// - sum_div_count: sum over real tokens / `count` given by the caller (the real
//                  tokens of the whole accumulation window: GA-4's correct form).
#pragma once

#include <cstdint>
#include <vector>

#include "harness/loss_value.hpp"
#include "harness/tensor.hpp"

namespace hr::ops {

enum class LossReduction { mean, sum, sum_div_count };

struct CrossEntropyConfig {
  int32_t ignore_index = -100;
  LossReduction reduction = LossReduction::mean;
  double count = 0;       // for sum_div_count
  float loss_scale = 1.f; // dlogits are multiplied by it (fp16 loss scaling)
  // The targets' values on the host, when the caller has them (a Batch does): the
  // range check and the count of real tokens then read them, not the device.
  const std::vector<int32_t>* host_targets = nullptr;
};

// Returns the reduced loss: per-token losses summed in double in token order, times
// the reduction's weight. On a GPU the per-token losses are copied back in stream
// order and summed when the value is first read (LossValue). losses: fp32 [N]
// per-token loss (0 for ignored tokens), may be undefined.
LossValue cross_entropy_forward(const Tensor& logits, const Tensor& targets, const CrossEntropyConfig& cfg,
                                Tensor& losses);
// dlogits (overwritten, dtype of logits or fp32) = loss_scale * d(reduced loss)/d(logits).
void cross_entropy_backward(const Tensor& logits, const Tensor& targets, const CrossEntropyConfig& cfg,
                            Tensor& dlogits);
// Number of targets != ignore_index (read from host_targets when given).
int64_t count_real_tokens(const Tensor& targets, int32_t ignore_index,
                          const std::vector<int32_t>* host_targets = nullptr);

}  // namespace hr::ops
