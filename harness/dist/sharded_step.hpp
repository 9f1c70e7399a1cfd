// ZeRO's three stages as one data-parallel training step (StepConfig::sharding,
// docs/catalogue.md DP-3, DP-5, DP-6): every rank takes its slice of the global
// batch, and the trainable parameters are cut into units, one per block of the
// model plus one for the parameters used outside the blocks (embeddings, head), as
// FSDP wraps each block. Unit u of P_u elements is a flat vector padded to
// N x S_u, S_u = ceil(P_u / N); rank r owns elements [r S_u, (r + 1) S_u).
//
//   zero1  every rank holds the whole model and its gradients; the gradients are
//          reduce-scattered once per window, each rank updates its shard with its
//          shard of the optimizer state, and the masters are all-gathered.
//   zero2  as zero1, but a unit's full gradient exists only while its block's
//          backward runs: right after it, it is reduce-scattered and added into
//          the rank's gradient shard (every micro-batch), then freed.
//   zero3  as zero2, and a rank holds only its shard of the fp32 masters: a unit's
//          parameters (in the compute dtype) are all-gathered before its block's
//          forward and again before its backward (and a recompute), and freed
//          after each; the outside unit is gathered for the whole pass.
//
// The window's real-item count is all-reduced before its micro-batches run, and each
// micro-batch's loss is divided by it (GA-4's token-weighted normalisation across
// ranks, with the loss gradient rounded as one process rounds it in 16-bit). Buffers go to
// the communicator as they are: host memory for the MPI engine on CPU ranks,
// device memory for NCCL. fp32 and bf16 (fp32 masters, fp32 gradients); AdamW or
// SGD; no adapters.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "harness/dist/communicator.hpp"
#include "harness/step/train_step.hpp"

namespace hr::dist {

// Wrong on purpose (the controls of DP-3, DP-5, DP-6, DP-MEM and DP-COMM).
enum class ShardFault : uint8_t {
  none,
  drop_rank_contribution,    // the last rank sends zeros to every gradient reduce-scatter
  shard_one_short,           // every shard's optimizer state, and so its update, one element short
  last_micro_batch_only,     // zero2/zero3: a shard is set to each micro-batch's reduction, not added to
  gather_reuses_previous,    // zero3: one block's backward reads the buffer gathered for the block after it
  keep_full_gradients,       // zero2/zero3: no full gradient buffer is freed after its reduce-scatter
  all_reduce_gradients,      // the gradients are all-reduced in full and each rank keeps its shard
  reduce_scatter_one_short,  // the outside unit's reduce-scatter leaves each rank's last element out
  fp16_reduce_scatter,       // every rank rounds what it sends to each reduce-scatter to (scaled) fp16
  whole_state,               // every rank holds the optimizer state of its units whole (N x S), not its shard
};
const char* shard_fault_name(ShardFault f);

struct ShardedStepResult {
  double loss = 0;          // the global batch's loss: all-reduced sum over real items / their count
  double global_items = 0;  // real items of the whole batch
  int64_t micro_batches = 0;  // on this rank
  CommStats gradients;      // this step's gradient collectives (reduce-scatters, or all-reduces)
  CommStats parameters;     // this step's parameter all-gathers
  CommStats other;          // the item count and the loss
};

class ShardedStep final : private PassHooks {
 public:
  // `global` is the configuration of the whole step (batch = global rows, each
  // rank's batch / N rows in micro-batches of micro_batch rows) with sharding
  // zero1, zero2 or zero3. collective_delay_s: rank r sleeps r x this before every
  // all-gather and reduce-scatter (ranks reach each collective at different times).
  ShardedStep(Device& dev, Communicator& comm, const StepConfig& global, ShardFault fault = ShardFault::none,
              double collective_delay_s = 0);
  ~ShardedStep() override;
  ShardedStep(const ShardedStep&) = delete;
  ShardedStep& operator=(const ShardedStep&) = delete;

  // One optimizer step on the global batch (every rank passes the same batch and
  // takes its slice). Collective.
  ShardedStepResult step(const Batch& global_batch);

  // Every trainable parameter's fp32 master, whole, in parameter order (zero3:
  // all-gathered from the shards, so collective).
  std::vector<std::pair<std::string, std::vector<float>>> parameters();

  Sharding level() const { return level_; }
  int64_t units() const { return static_cast<int64_t>(units_.size()); }
  int64_t trainable_elements() const;  // P = sum of P_u
  int64_t padded_elements() const;     // sum of N x S_u
  int64_t largest_unit_padded() const; // max of N x S_u over the blocks (not the outside unit)
  int64_t rows_per_rank() const { return rows_; }
  int64_t micro_batches_per_rank() const { return rows_ / global_.micro_batch; }
  TrainStep& local() { return *step_; }
  ShardFault fault() const { return fault_; }

 private:
  struct Unit {
    std::vector<size_t> params;    // indices into params().all() (trainable)
    std::vector<int64_t> offsets;  // each one's offset in the unit's flat vector
    std::vector<Shape> shapes;     // and shape
    int64_t elements = 0, shard = 0;
    Tensor master_flat;   // zero1/zero2: [N S] fp32, the parameters' masters are views
    Tensor master_shard;  // zero3: [S] fp32, the rank's shard
    Tensor grad_flat;     // zero1: always; zero2/zero3: while its backward runs
    Tensor grad_shard;    // [S] fp32
    Tensor state_a, state_b;  // [S]: AdamW's moments, or SGD's momentum (state_a)
    Tensor gathered;      // zero3: [N S] in the compute dtype, while gathered
  };

  void before_pass(bool backward) override;
  void after_pass(bool backward) override;
  void before_block_forward(int64_t block) override;
  void after_block_forward(int64_t block) override;
  void before_block_backward(int64_t block) override;
  void after_block_backward(int64_t block) override;

  Unit& root() { return units_.back(); }
  void gather(Unit& u);
  void gather_into(Unit& u, Tensor& recv);
  void bind_compute(Unit& u, const Tensor& flat);
  void release_gathered(Unit& u);
  void open_gradients(Unit& u);
  void reduce_gradients(Unit& u, bool add);
  void close_gradients(Unit& u);
  void update(Unit& u);
  void all_gather_masters(Unit& u);
  void delay() const;
  // Runs a collective, adding what it moved to `into`.
  template <typename F>
  void counted(CommStats& into, F&& collective);
  void all_gather_tensor(const Tensor& send, Tensor& recv);
  void reduce_scatter_tensor(const Tensor& send, Tensor& recv);

  Device* dev_;
  Communicator* comm_;
  StepConfig global_;
  Sharding level_;
  ShardFault fault_;
  double delay_s_;
  int64_t rows_ = 0;
  std::unique_ptr<TrainStep> step_;
  std::vector<Unit> units_;  // blocks in order, then the outside unit
  int64_t applied_ = 0;
  int64_t stale_unit_ = -1;  // gather_reuses_previous: the block whose backward reads the next one's buffer
  Tensor stale_;             // that buffer, kept
  ShardedStepResult current_;
};

}  // namespace hr::dist
