// The controlled decoder-only transformer (GPT-2 shape, pre-LayerNorm):
// token + position embedding, L blocks of
//   x1 = x + dropout(Wo . attn(LN1(x)))         (multi-head causal self-attention,
//                                                optional padding / packing mask,
//                                                dropout on its probabilities)
//   x2 = x1 + dropout(W2 . gelu(W1 . LN2(x1)))
// then a final LayerNorm, an untied LM head (no bias) and cross-entropy with an
// ignore index. Attention is naive (T x T probabilities kept) or memory-efficient
// (only the row log-sum-exp kept), kernels/attention.
//
// Weight layout [out, in] (PyTorch nn.Linear). Initialisation (GPT-2): every
// weight matrix and both embeddings normal(0, 0.02), the two residual output
// projections normal(0, 0.02 / sqrt(2 L)), biases zero, LayerNorm gamma one and
// beta zero. Parameter names: wte, wpe, h.{i}.ln1.{weight,bias},
// h.{i}.attn.{q,k,v,proj}.{weight,bias}, h.{i}.ln2.{weight,bias},
// h.{i}.mlp.{fc,proj}.{weight,bias}, ln_f.{weight,bias}, lm_head.weight.
//
// LoRA (lora_rank > 0): every base parameter is frozen (no gradient buffer, no
// optimizer state) and the q and v projections (separate matrices, not a fused
// qkv) get y += (alpha / r) (x A^T) B^T with A [r, C] uniform(+-1/sqrt(C)) (the
// kaiming-uniform bound of nn.Linear) and B [C, r] zero, named
// h.{i}.attn.{q,v}.lora_{A,B}, added after every base parameter so the base draws
// the same Philox values as without adapters. The adapter's [N, r] product is
// recomputed in the backward pass, not kept; frozen LayerNorms take their
// parameter gradients into fp32 [C] workspace temporaries (the kernel needs them).
//
// Activations kept per block (N = B*T tokens, C = d_model, H heads, s = bytes of
// the compute dtype), the formula MEM-1 predicts with:
//   x (block input) N C s | LN1 out N C s + mean, rstd 2 N 4 | q, k, v 3 N C s |
//   attention out N C s | naive: probabilities B H T T s, memory-efficient:
//   log-sum-exp B H T 4 | x1 N C s | LN2 out N C s + mean, rstd 2 N 4 |
//   fc out r N C s | gelu out r N C s        (r = mlp_ratio)
//   = N C s (8 + 2 r) + 16 N + attention's own; written out in step/memory_model.cpp.
// The merged attention output (input of Wo) is re-merged in the backward pass
// instead of kept; dropout keeps no mask (it is replayed from Philox), and the
// probabilities kept are the undropped ones (dropout on them, naive attention only,
// is applied again in the backward pass).
#pragma once

#include <memory>

#include "harness/models/model.hpp"
#include "harness/models/presets.hpp"
#include "kernels/softmax/softmax.hpp"

namespace hr {

class TransformerModel final : public Model, private BlockStack {
 public:
  TransformerModel(Device& dev, const TransformerConfig& cfg, ParamStorage storage, uint64_t seed,
                   int64_t lora_rank = 0, float lora_alpha = 0.f);
  int64_t lora_rank() const { return lora_rank_; }
  float lora_scale() const { return lora_scale_; }

  const char* name() const override { return "transformer"; }
  const TransformerConfig& config() const { return cfg_; }
  LossValue forward_backward(const Batch& mb, const LossSpec& loss, PassOptions& opt) override;
  LossValue forward_loss(const Batch& mb, const LossSpec& loss, PassOptions& opt) override;
  int64_t loss_items(const Batch& mb) const override;
  int64_t num_blocks() const override { return cfg_.layers; }
  std::vector<int64_t> param_blocks() const override;

 private:
  struct BlockParams {
    int ln1_w, ln1_b, q_w, q_b, k_w, k_b, v_w, v_b, o_w, o_b, ln2_w, ln2_b, fc_w, fc_b, proj_w, proj_b;
    int q_la = -1, q_lb = -1, v_la = -1, v_lb = -1;  // LoRA A and B of q and v (-1: none)
  };
  // lin += scale (x A^T) B^T
  void lora_forward(int a, int b, const Tensor& x, Tensor& lin);
  // A's and B's gradients from the projection's output gradient dlin; dx += its path's share.
  void lora_backward(int a, int b, const Tensor& x, const Tensor& dlin, Tensor& dx);
  // LayerNorm backward; a frozen norm's parameter gradients go to workspace temporaries.
  void layernorm_backward_params(const Tensor& dy, const Tensor& x, int w, int b, const Tensor& mean,
                                 const Tensor& rstd, Tensor& dx);
  struct State;

  Param& P(int i) { return params_.all()[static_cast<size_t>(i)]; }
  Tensor block_forward(int64_t i, const Tensor& x, bool keep, bool recompute, Consumer out_consumer,
                       DropoutStream& rng, std::unique_ptr<BlockState>* state) override;
  Tensor block_backward(int64_t i, BlockState& state, const Tensor& dy, bool need_dx) override;
  LossValue run(const Batch& mb, const LossSpec& loss, PassOptions& opt, bool backward);

  TransformerConfig cfg_;
  DType dtype_;
  int wte_, wpe_, lnf_w_, lnf_b_, head_w_;
  int64_t lora_rank_ = 0;
  float lora_scale_ = 0.f;  // alpha / r
  std::vector<BlockParams> blocks_;
  // Per micro-batch context the blocks read.
  int64_t B_ = 0, T_ = 0;
  ops::AttnMask mask_;
  KeptLabelFault label_fault_ = KeptLabelFault::none;
};

}  // namespace hr
