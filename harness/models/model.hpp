// The interface both controlled models implement for the training step: one
// micro-batch forward + loss + backward (parameter gradients accumulate in fp32),
// or forward + loss only. The step decides how the loss is normalised and scaled
// (LossSpec) and owns the dropout stream and the checkpoint policy (PassOptions).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "harness/data/batch.hpp"
#include "harness/loss_value.hpp"
#include "harness/models/params.hpp"
#include "harness/models/presets.hpp"
#include "harness/step/checkpoint.hpp"
#include "kernels/crossentropy/crossentropy.hpp"

namespace hr {

// The loss of one micro-batch is sum over its real items (tokens or output
// elements) of the per-item loss, divided by `count`, times `multiplier`
// (the controlled-gradient-magnitude knob); the backward pass additionally
// multiplies by `loss_scale` (fp16 loss scaling).
struct LossSpec {
  double count = 1;         // normaliser (> 0)
  double multiplier = 1;    // scales loss and gradients alike
  float loss_scale = 1.f;   // scales the gradients only
};

struct PassOptions {
  CheckpointPolicy checkpoint;
  DropoutStream* rng = nullptr;             // required; advanced by every dropout draw
  std::vector<int64_t>* segment_forward_counts = nullptr;  // if set, += per segment
  bool update_running_stats = true;          // BatchNorm running statistics
  // Called by forward_backward once the loss is computed and before the backward
  // pass allocates anything: the forward/backward boundary (MEM-1 reads the
  // tracker's live bytes there). Empty: not called.
  std::function<void()> on_forward_end;
  KeptLabelFault kept_label_fault = KeptLabelFault::none;  // MEM-1's negative controls
  // Called by the transformer's passes with the micro-batch's logits [B*T, V] once
  // computed (LR-2 compares them). Empty: not called.
  std::function<void(const Tensor& logits)> on_logits;
  // Called around each block's forward and backward by the checkpoint driver
  // (a sharded step's gathers and reductions); nullptr: none.
  PassHooks* hooks = nullptr;
};

class Model {
 public:
  virtual ~Model() = default;
  virtual const char* name() const = 0;  // "mlp" | "transformer"
  ParamSet& params() { return params_; }
  const ParamSet& params() const { return params_; }

  // Forward, loss and backward of one micro-batch. Gradients accumulate (+=) into
  // each parameter's fp32 grad. Returns the micro-batch's loss (as LossSpec says,
  // without loss_scale); on a GPU it is read back when first asked for.
  virtual LossValue forward_backward(const Batch& mb, const LossSpec& loss, PassOptions& opt) = 0;
  // Forward and loss only: nothing is kept, no gradient touched. BatchNorm still
  // normalises with batch statistics (training mode) and updates its running
  // statistics only if opt.update_running_stats.
  virtual LossValue forward_loss(const Batch& mb, const LossSpec& loss, PassOptions& opt) = 0;

  // Number of items the loss of `mb` sums over (real tokens / output elements).
  virtual int64_t loss_items(const Batch& mb) const = 0;
  // Blocks the checkpoint policy cuts into segments.
  virtual int64_t num_blocks() const = 0;
  // For each parameter (params().all() order) the block whose forward and backward
  // alone read it and write its gradient, or -1 for one the model uses outside its
  // blocks (embeddings, the head): what a sharded step gathers per block.
  virtual std::vector<int64_t> param_blocks() const = 0;

  // Non-parameter state (BatchNorm running statistics), by name; empty otherwise.
  virtual std::vector<std::pair<std::string, Tensor>> buffers() const { return {}; }

  // Forward executions of each block since construction (or the last reset),
  // counted inside the block's own forward, not by the checkpoint driver that
  // schedules it: what CK-4 and BN-3 read to see that a recompute happened.
  const std::vector<int64_t>& block_forward_counts() const { return block_forwards_; }
  void reset_block_forward_counts() { block_forwards_.clear(); }

 protected:
  explicit Model(ParamSet params) : params_(std::move(params)) {}
  void count_block_forward(int64_t block) {
    if (static_cast<int64_t>(block_forwards_.size()) <= block) block_forwards_.resize(static_cast<size_t>(block) + 1, 0);
    ++block_forwards_[static_cast<size_t>(block)];
  }
  ParamSet params_;
  std::vector<int64_t> block_forwards_;
};

}  // namespace hr
