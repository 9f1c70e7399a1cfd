// The analytical memory model of a training step (MEM-1, MEM-2): bytes per
// consumer, the total peak (workspace included) and the activations alive at the
// forward/backward boundary, predicted from the configuration alone, to compare
// with what the tracking allocator measures.
//   weights          = P * 4 (fp32 masters) + P * s (16-bit compute copies)
//                      [+ BatchNorm running statistics 2 * W * 4 per norm layer]
//   gradients        = P' * 4 (fp32 accumulation; P' the trainable parameters: all,
//                      or with LoRA only the adapters r * (in + out) per adapted matrix)
//   optimizer state  = (over P') AdamW 8 * P', SGD with momentum 4 * P, 8-bit AdamW per tensor
//                      2 * n + 8 * ceil(n / block) (8 * n under 4096 elements), else 0
//   activations      = the per-layer formula (layer_terms, in the spirit of
//                      Korthikanti et al. 2022's s*b*h*(34 + 5*a*s/h)), peak over the
//                      forward pass and each checkpoint segment's recompute
//   workspace, total = a replay of the step's allocations by size, in order: what
//                      each block's forward and backward allocate and free, the
//                      kernels' own buffers (on the CPU fp32 copies of 16-bit matmul
//                      operands and the memory-efficient attention's per-head rows; on
//                      a GPU the reductions' partial sums), the batch.
// Sizes only: nothing is allocated and no model is built.
#pragma once

#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "harness/device.hpp"
#include "harness/step/step_config.hpp"

namespace hr {

// A prediction that is wrong on purpose (MEM-1's subtle negative control).
enum class PredictionFault : uint8_t {
  none,
  omit_norm_stats,  // forgets the normalisation layers' saved fp32 statistics (LayerNorm 8 bytes per row)
  ignore_checkpointing,  // predicts the step as if nothing were checkpointed
};

struct MemoryPrediction {
  // Per consumer: the peak over the step (each its own high-water mark, as the tracker keeps them).
  size_t weights = 0, gradients = 0, optimizer_state = 0, activations = 0, workspace = 0;
  size_t total_peak = 0;   // high-water mark of the sum of all five
  size_t batch_bytes = 0;  // the batch (workspace), alive through the step
  // Activations alive at the first micro-batch's forward/backward boundary (after the loss).
  size_t boundary_activations = 0;
  int64_t parameters = 0;
  nlohmann::json layer_terms = nlohmann::json::object();  // the per-layer formula, term by term
  nlohmann::json timeline = nlohmann::json::object();     // where each peak falls in the step
  size_t of(Consumer c) const;
  size_t static_bytes() const { return weights + gradients + optimizer_state; }
};

// A rough size of one step in floating point (weights, optimizer state, the
// largest activations and logits), and its largest term with the fields it grows
// with. Never overflows within validate()'s ranges.
struct RoughStepBytes {
  double total = 0, largest = 0;
  const char* largest_term = "";
};
RoughStepBytes rough_step_bytes(const StepConfig& cfg);
// predict_memory refuses (InvalidArgument) a step whose rough size is past this.
inline constexpr double kMaxPredictableBytes = 0x1p60;

// `backend` selects the kernels' own buffers (they differ between the CPU and CUDA).
MemoryPrediction predict_memory(const StepConfig& cfg, BackendKind backend = BackendKind::cpu,
                                PredictionFault fault = PredictionFault::none);

// Element counts of a configuration's parameter tensors, in the model's order.
std::vector<int64_t> parameter_tensor_sizes(const StepConfig& cfg);
// Those that own a gradient and optimizer state (LoRA: the adapters only).
std::vector<int64_t> trainable_tensor_sizes(const StepConfig& cfg);
// Parameter count of a configuration's model (no allocation).
int64_t parameter_count(const StepConfig& cfg);

// Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer
// Models", section 4.1): per transformer layer s*b*h*(34 + 5*a*s/h) bytes in 16-bit,
// term by term (attention 11sbh + 5as^2b, MLP 19sbh, LayerNorms 4sbh), beside this
// model's own terms: the published numbers, the same terms in this configuration's
// dtype (masks 1 byte per element), which of them this model does not have and why,
// and what it keeps that the paper does not count. Transformer only (else null).
nlohmann::json korthikanti_comparison(const StepConfig& cfg);

}  // namespace hr
