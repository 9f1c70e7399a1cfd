// Activation checkpointing over a stack of blocks, shared by both models.
//
// Without checkpointing every block keeps what its backward pass needs
// (Consumer::activations). With checkpointing every k blocks, the stack is cut
// into segments of k blocks: the forward pass keeps only each segment's input
// (its intermediates are Consumer::workspace and freed as it goes); the backward
// pass re-runs the segment's forward, keeping its intermediates this time, then
// runs the segment's backward. Dropout replays: the recompute restarts the
// Philox stream at the (seed, offset) the segment's first forward started from,
// so the masks, and therefore the gradients, are bit-identical to the run without
// checkpointing (CK-1). The broken variant draws from a fresh state instead
// (CK-2's negative control). The driver counts forward executions per segment;
// the models count their block forwards themselves (CK-4 reads those).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "harness/tensor.hpp"
#include "harness/step/dropout_keys.hpp"

namespace hr {

struct CheckpointPolicy {
  int64_t every_k_blocks = 0;  // 0: no checkpointing; >= number of blocks: one segment
  // Negative controls (both wrong on purpose):
  bool fresh_rng_on_recompute = false;    // CK-2: the recompute draws new dropout masks
  bool update_bn_stats_on_recompute = false;  // BN-3: running statistics updated twice
  // CK-1's subtle control: the first segment's recompute flips this many elements
  // of its first mask (of the first sample); 0: off.
  int64_t fault_flip_mask_elements = 0;
  // CK-4's subtle controls: the first segment's recompute runs its first block's
  // forward this many extra times (results discarded), or, without checkpointing,
  // the forward pass does; 0: off.
  int64_t fault_extra_block_forwards = 0;
  // A driver that is told to checkpoint but keeps every block's activations and
  // never recomputes (CK-4's gross control; BN-3 and CK-1 must call it an error).
  bool fault_never_recompute = false;
  // CK-5's and BN-3's subtle gradient control: a checkpointed step leaves this many
  // non-zero elements of its first trainable gradient one ulp up (after the
  // unscale), as a recompute whose reductions sum in another order than the first
  // forward's does; 0: off.
  int64_t fault_grad_ulp_elements = 0;
  // CK-3's subtle controls: a recompute whose activations stay held (a second
  // reference) after their segment's backward, until the pass ends, so the peak
  // grows like L again; and a driver that checkpoints every block when told not to.
  bool fault_keep_recomputed = false;
  bool fault_off_checkpoints_every_block = false;
  bool enabled() const { return every_k_blocks > 0; }
};

// What a block keeps for its backward pass (model-specific).
struct BlockState {
  virtual ~BlockState() = default;
};

// What a model exposes to the checkpoint driver.
class BlockStack {
 public:
  virtual ~BlockStack() = default;
  virtual int64_t num_blocks() const = 0;
  // Runs block i on x and returns its output (allocated with `out_consumer`).
  // keep: the block's saved tensors are Consumer::activations and returned in
  // *state; otherwise they are workspace and dropped. recompute: this is a
  // checkpoint recompute (state such as BatchNorm running statistics must not be
  // updated again).
  virtual Tensor block_forward(int64_t i, const Tensor& x, bool keep, bool recompute, Consumer out_consumer,
                               DropoutStream& rng, std::unique_ptr<BlockState>* state) = 0;
  // Backward of block i: parameter gradients accumulate (+=); returns dx
  // (workspace). need_dx false: the input needs no gradient (may return undefined).
  virtual Tensor block_backward(int64_t i, BlockState& state, const Tensor& dy, bool need_dx) = 0;
};

// Called around the pieces of a pass, so that a sharded step
// (harness/dist/sharded_step.hpp) can gather a block's parameters just before they
// are read and reduce its gradients as soon as they are complete. The checkpoint
// driver calls the block hooks around every block_forward (a recompute's too) and
// every block_backward; the training step calls the pass hooks around each
// micro-batch's forward (and backward).
class PassHooks {
 public:
  virtual ~PassHooks() = default;
  virtual void before_pass(bool backward) { (void)backward; }
  virtual void after_pass(bool backward) { (void)backward; }
  virtual void before_block_forward(int64_t block) { (void)block; }
  virtual void after_block_forward(int64_t block) { (void)block; }
  virtual void before_block_backward(int64_t block) { (void)block; }
  virtual void after_block_backward(int64_t block) { (void)block; }
};

// One forward + backward of a block stack under a policy.
class CheckpointedStack {
 public:
  CheckpointedStack(BlockStack& stack, const CheckpointPolicy& policy, PassHooks* hooks = nullptr);

  // x is kept (by reference) as the first segment's input. Returns the last
  // block's output (Consumer::activations).
  Tensor forward(const Tensor& x, DropoutStream& rng);
  // Returns d(input) (workspace), or undefined when need_dx is false.
  Tensor backward(const Tensor& dy, bool need_dx);

  int64_t num_segments() const { return static_cast<int64_t>(segments_.size()); }
  // Forward executions of each segment in this pass (1 without recompute, 2 with).
  const std::vector<int64_t>& forward_counts() const { return forward_counts_; }
  // totals[s] += forward_counts()[s] (totals grows as needed); no-op for nullptr.
  void add_forward_counts_to(std::vector<int64_t>* totals) const;

 private:
  struct Segment {
    int64_t first = 0, end = 0;  // blocks [first, end)
    Tensor input;                // kept when checkpointing
    DropoutStream rng;           // the dropout state at the segment's first forward (no log)
    std::vector<std::unique_ptr<BlockState>> states;  // per block (no checkpointing, or recomputed)
  };
  void recompute(Segment& s);
  // stack_->block_forward / block_backward between the hooks.
  Tensor run_forward(int64_t i, const Tensor& x, bool keep, bool recompute, Consumer out_consumer, DropoutStream& rng,
                     std::unique_ptr<BlockState>* state);
  Tensor run_backward(int64_t i, BlockState& state, const Tensor& dy, bool need_dx);

  BlockStack* stack_;
  PassHooks* hooks_;
  CheckpointPolicy policy_;
  uint64_t fresh_offset_ = 0;  // where the broken variant draws from
  std::vector<Segment> segments_;
  std::vector<std::unique_ptr<BlockState>> kept_;  // fault_keep_recomputed's second references, freed at the pass's end
  std::vector<int64_t> forward_counts_;
};

}  // namespace hr
