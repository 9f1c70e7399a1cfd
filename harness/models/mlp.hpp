// The controlled MLP: L linear layers of width W ([out, in] weights), each but the
// last followed by [norm] -> GELU -> dropout (one "block" for checkpointing),
// the last mapping to out_dim: MSE against regression targets or cross-entropy
// over out_dim classes. The norm slot is none, LayerNorm (per sample) or
// BatchNorm (across the micro-batch; optionally "ghost" BatchNorm over virtual
// batches of bn_virtual_batch rows, BN-2's positive control).
//
// Initialisation (PyTorch nn.Linear's default): weights and biases
// uniform(-1/sqrt(in), 1/sqrt(in)); norm gamma one, beta zero; BatchNorm running
// mean zero, running variance one. Names: layers.{i}.{weight,bias},
// norms.{i}.{weight,bias}; buffers norms.{i}.{running_mean,running_var}.
//
// Activations kept per block i (N rows, s = bytes of the compute dtype):
//   block input N in_i s | linear out N W s | norm: out N W s, plus LayerNorm
//   mean, rstd 2 N 4 or BatchNorm batch mean, rstd 2 W 4 per virtual batch.
// (The GELU output is dropout's input only; dropout keeps no mask.) The head
// keeps its input (the last block's output, N W s) and the prediction N out s.
//
// LoRA (lora_rank > 0; norm none or LayerNorm): every base parameter frozen, and
// each hidden linear (layers 0 .. L-2, the blocks') gets h += (alpha / r) (x A^T) B^T,
// layers.{i}.lora_{A,B}, A [r, in] uniform(+-1/sqrt(in)), B [W, r] zero, added after
// the base; [N, r] recomputed in the backward pass. A frozen LayerNorm's parameter
// gradients go to fp32 [W] workspace temporaries.
#pragma once

#include <memory>

#include "harness/models/model.hpp"
#include "harness/models/presets.hpp"

namespace hr {

class MlpModel final : public Model, private BlockStack {
 public:
  MlpModel(Device& dev, const MlpConfig& cfg, ParamStorage storage, uint64_t seed, int64_t lora_rank = 0,
           float lora_alpha = 0.f);

  const char* name() const override { return "mlp"; }
  const MlpConfig& config() const { return cfg_; }
  LossValue forward_backward(const Batch& mb, const LossSpec& loss, PassOptions& opt) override;
  LossValue forward_loss(const Batch& mb, const LossSpec& loss, PassOptions& opt) override;
  int64_t loss_items(const Batch& mb) const override;
  int64_t num_blocks() const override { return cfg_.layers - 1; }
  std::vector<int64_t> param_blocks() const override;
  std::vector<std::pair<std::string, Tensor>> buffers() const override;

  // BatchNorm running statistics of block i (fp32 [W]); undefined without BatchNorm.
  const Tensor& running_mean(int64_t i) const { return running_mean_[static_cast<size_t>(i)]; }
  const Tensor& running_var(int64_t i) const { return running_var_[static_cast<size_t>(i)]; }

 private:
  struct State;
  Param& P(int i) { return params_.all()[static_cast<size_t>(i)]; }
  Tensor block_forward(int64_t i, const Tensor& x, bool keep, bool recompute, Consumer out_consumer,
                       DropoutStream& rng, std::unique_ptr<BlockState>* state) override;
  Tensor block_backward(int64_t i, BlockState& state, const Tensor& dy, bool need_dx) override;
  LossValue run(const Batch& mb, const LossSpec& loss, PassOptions& opt, bool backward);
  int64_t virtual_batch(int64_t rows) const;

  MlpConfig cfg_;
  DType dtype_;
  std::vector<int> w_, b_, gamma_, beta_;  // per layer; gamma_/beta_ -1 without a norm
  std::vector<int> la_, lb_;               // per block: LoRA A and B (empty without adapters)
  int64_t lora_rank_ = 0;
  float lora_scale_ = 0.f;
  std::vector<Tensor> running_mean_, running_var_;
  // Per pass.
  bool update_stats_ = true;
  bool bn_update_on_recompute_ = false;
  KeptLabelFault label_fault_ = KeptLabelFault::none;
};

}  // namespace hr
