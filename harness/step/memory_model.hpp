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
// For each of parameter_tensor_sizes' tensors, the block whose forward and backward
// alone use it, or -1 for one used outside the blocks (embeddings, the head).
std::vector<int64_t> parameter_tensor_blocks(const StepConfig& cfg);

// What one of N data-parallel ranks holds of the static consumers under
// cfg.sharding (ZeRO stages, Rajbhandari et al. 2020), in the layout of
// harness/dist/sharded_step.hpp: the trainable tensors in units (each block, then
// the tensors outside the blocks), unit u's P_u elements padded to N x S_u,
// S_u = ceil(P_u / N), the rank holding S_u of each. fp32 masters, fp32 gradients,
// the compute dtype's copies; AdamW 8 or SGD with momentum 4 bytes of state per
// element of the shard.
//   zero1   weights   N S x 4 + P x s (16-bit copies)    gradients N S x 4 + S x 4
//   zero2   weights   as zero1                           gradients S x 4, at the peak
//                                                        + the outside unit's and the largest block's N S_u x 4
//   zero3   weights   S x 4, at the peak + the outside unit and the largest block gathered, N S_u x s
//           gradients as zero2
// (S, N S: summed over units). Communication per step, in elements as nccl-tests
// count payload (a reduce-scatter's input, an all-gather's output), K micro-batches
// per rank: zero1 N S of reduce-scatter and N S of all-gather; zero2 K N S and N S;
// zero3 K N S and K (N S_outside + 2 sum over blocks N S_b), plus a block's N S_b for
// every recompute under checkpointing. ZeRO's analytical volumes, 2 P for zero1 and
// zero2 and 3 P for zero3 at K = 1, are these less the padding (and, for zero3, the
// outside unit's second gather, which FSDP's root unit skips by holding it through
// the pass).
struct ShardedPrediction {
  Sharding level = Sharding::none;
  int64_t ranks = 1, micro_batches = 1;
  int64_t parameters = 0;      // P, trainable
  int64_t shard = 0;           // sum of S_u: what one rank owns
  int64_t padded = 0;          // sum of N S_u
  int64_t outside_padded = 0;  // N S_u of the unit outside the blocks
  int64_t largest_block_padded = 0;
  size_t weights = 0, weights_peak = 0;
  size_t gradients = 0, gradients_peak = 0;
  size_t optimizer_state = 0;
  double gradient_elements = 0;   // per step, payload
  double parameter_elements = 0;  // per step, payload
  // ZeRO's analytical per-step volume in elements (2 P or 3 P, times K for the
  // per-micro-batch collectives), for comparison.
  double zero_paper_elements = 0;
  size_t static_bytes() const { return weights + gradients + optimizer_state; }
};
// InvalidArgument for sharding none, ranks < 1, adapters or another optimizer than
// adamw or sgd (what the sharded step refuses too).
ShardedPrediction predict_sharded(const StepConfig& cfg, int64_t ranks);

// Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer
// Models", section 4.1): per transformer layer s*b*h*(34 + 5*a*s/h) bytes in 16-bit,
// term by term (attention 11sbh + 5as^2b, MLP 19sbh, LayerNorms 4sbh), beside this
// model's own terms: the published numbers, the same terms in this configuration's
// dtype (masks 1 byte per element), which of them this model does not have and why,
// and what it keeps that the paper does not count. Transformer only (else null).
nlohmann::json korthikanti_comparison(const StepConfig& cfg);

}  // namespace hr
