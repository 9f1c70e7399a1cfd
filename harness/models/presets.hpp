// The two controlled models' configurations and their quick / full sizes, in one
// place. quick runs a step in well under a second on a 2-core CPU; full is sized
// for one H200 (bf16, tens of GiB of activations without checkpointing).
#pragma once

#include <cstdint>
#include <string>

#include "harness/registry.hpp"

namespace hr {

enum class NormKind : uint8_t { none, layernorm, batchnorm };
const char* norm_kind_name(NormKind k);  // "none" | "layernorm" | "batchnorm"
NormKind parse_norm_kind(const std::string& s);

enum class MlpTask : uint8_t { regression, classification };
const char* mlp_task_name(MlpTask t);  // "regression" | "classification"

// MEM-1's negative controls (wrong on purpose): a tensor the backward pass needs is
// charged to Consumer::workspace instead of Consumer::activations. The bytes stay
// the same; only the label lies, which the tracker's consumer peaks and the
// label-independent count at the forward/backward boundary must both see.
enum class KeptLabelFault : uint8_t {
  none,
  norm_stats,    // subtle: the normalisation layers' saved fp32 statistics (mean, rstd)
  block_hidden,  // gross: transformer: each block's MLP fc output; MLP: each block's linear output
};
const char* kept_label_fault_name(KeptLabelFault f);  // "none" | "norm_stats" | "block_hidden"

// MLP: `layers` linear layers. Layer 0 maps in_dim -> width, layers 1..L-2 map
// width -> width, layer L-1 maps width -> out_dim. Every layer but the last is
// followed by [norm] -> GELU -> dropout; that group is one "block" for
// checkpointing. Regression: MSE against out_dim targets; classification:
// cross-entropy over out_dim classes.
struct MlpConfig {
  int64_t in_dim = 32;
  int64_t width = 128;
  int64_t out_dim = 16;
  int64_t layers = 4;  // >= 2
  NormKind norm = NormKind::none;
  MlpTask task = MlpTask::regression;
  float dropout = 0.f;
  float norm_eps = 1e-5f;
  float bn_momentum = 0.1f;
  // Ghost batch norm: statistics over virtual batches of this many rows inside a
  // micro-batch (0 = the whole micro-batch). BN-2's positive control.
  int64_t bn_virtual_batch = 0;
  // Faults injected on purpose for the BN properties' subtle negative controls
  // (docs/catalogue.md POWER); zero in a correct model.
  // BN-1: every row entering LayerNorm is mixed with this fraction of the batch's
  // mean row, a per-sample norm that leaks across the batch.
  float fault_ln_batch_leak = 0.f;
  // BN-2: ghost BatchNorm's virtual batch c normalises its rows mixed with this
  // fraction of the next virtual batch's rows (its statistics take in a neighbour).
  float fault_ghost_bn_neighbour_leak = 0.f;
  // BN-3: a checkpoint recompute updates the running statistics of this many
  // channels (the first) of every BatchNorm again (checkpoint.update_bn_stats_on_recompute:
  // all of them).
  int64_t fault_bn_recompute_channels = 0;
};

// Decoder-only transformer (GPT-2 shape, pre-LayerNorm). Per block:
//   x1 = x + dropout(Wo(attn(LN1(x))));  x2 = x1 + dropout(W2(gelu(W1(LN2(x1)))))
// with attn = dropout(softmax(q k^T / sqrt(D))) v (three dropout sites, as GPT-2's).
// Attention is multi-head causal with an optional padding / packing mask.
struct TransformerConfig {
  int64_t vocab = 256;
  int64_t max_positions = 128;
  int64_t d_model = 64;
  int64_t heads = 4;
  int64_t layers = 2;
  int64_t mlp_ratio = 4;  // hidden width = mlp_ratio * d_model
  float dropout = 0.f;      // the MLP branch's output (before its residual add)
  // The attention branch's output before its residual add (GPT-2's resid_dropout
  // on attn.c_proj); < 0: the model's `dropout`.
  float attn_out_dropout = -1.f;
  // The attention probabilities (GPT-2's attn_dropout); < 0: the model's `dropout`
  // with naive attention, none with memory-efficient attention (its kernel has no
  // dropout; an explicit p > 0 there is refused).
  float attn_probs_dropout = -1.f;
  float ln_eps = 1e-5f;
  bool memory_efficient_attention = false;  // false: naive (scores materialised)
  int32_t ignore_index = -100;
  int64_t head_dim() const { return d_model / heads; }
  float attn_out_p() const { return attn_out_dropout < 0.f ? dropout : attn_out_dropout; }
  float attn_probs_p() const {
    if (attn_probs_dropout >= 0.f) return attn_probs_dropout;
    return memory_efficient_attention ? 0.f : dropout;
  }
};

// Model FLOPs of one trained token (forward and backward, recomputation not
// counted), as MFU counts them (PaLM, appendix B): 6 per matrix parameter (each
// block's q, k, v, output, fc and proj, and the untied head; not the embeddings,
// biases or norms) plus attention's 12 x layers x seq x d_model (QK^T and PV,
// 2 seq d_model each in the forward, twice that in the backward; the masked half
// of a causal score matrix is counted too).
inline double model_flops_per_token(const TransformerConfig& t, int64_t seq_len) {
  const double d = static_cast<double>(t.d_model);
  const double block_matrix = (4.0 + 2.0 * static_cast<double>(t.mlp_ratio)) * d * d;
  const double matrix = static_cast<double>(t.layers) * block_matrix + d * static_cast<double>(t.vocab);
  return 6.0 * matrix + 12.0 * static_cast<double>(t.layers) * static_cast<double>(seq_len) * d;
}

// A model size together with the batch a step runs on.
struct MlpPreset {
  MlpConfig model;
  int64_t batch = 0;
  int64_t micro_batch = 0;
};
struct TransformerPreset {
  TransformerConfig model;
  int64_t batch = 0;
  int64_t micro_batch = 0;
  int64_t seq_len = 0;
};

MlpPreset mlp_preset(Preset p);
TransformerPreset transformer_preset(Preset p);

}  // namespace hr
