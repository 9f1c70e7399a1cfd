// Data parallelism over a Communicator (docs/catalogue.md DP): each of N ranks takes
// its slice of the global batch, accumulates its K micro-batches as plain sums over
// real items, all-reduces the gradients once per window (or, as the comparison,
// after every micro-batch), all-reduces the window's real-item count too, and
// divides once by that global count: the token-weighted normalisation of GA-4
// holds across ranks. ZeRO-1 (Zero1AdamW) shards AdamW's moments over the ranks
// and all-gathers the parameters after the step.
//
// The gradients live in buckets, as PyTorch's DDP keeps them: flat fp32 tensors of
// about DpOptions::bucket_bytes each, every parameter's gradient a view into one,
// filled in the order the backward finishes them (the blocks from the last to the
// first, then the parameters used outside the blocks). Each bucket is all-reduced in
// place where it lives: host memory for the MPI engine on CPU ranks, device memory
// for NCCL on GPU ranks (nothing staged); only a GPU rank under the MPI engine
// stages through the host. With overlap, a bucket is all-reduced inside the
// reducing backward (the window's last; each one in every_micro_batch mode) as soon
// as every gradient in it is final, not after the backward: from a block's hook
// (harness/step/checkpoint.hpp) for block gradients, at the end of the pass for a
// bucket holding a parameter used outside the blocks; buckets go in one order on
// every rank. On a GPU, NCCL runs them on a stream of its own: a bucket's all-reduce
// waits for the kernels before it and runs beside the rest of the backward
// (Communicator::all_reduce_sum_deferred), and the device's work after the backward
// waits for every bucket (join; the plain all-reduce of the bucket that holds the
// parameters used outside the blocks, which follows them on NCCL's stream, orders
// them too).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "harness/dist/communicator.hpp"
#include "harness/step/train_step.hpp"

namespace hr::dist {

enum class DpSync : uint8_t {
  once_per_window,    // no_sync over the window: one all-reduce after K micro-batches
  every_micro_batch,  // one all-reduce per micro-batch, the reduced gradients summed
};

// Wrong on purpose (DP-2, DP-4 negative controls).
enum class DpFault : uint8_t {
  none,
  divide_by_n_twice,        // the global count times N: the division by N done twice
  skip_all_reduce_one_rank, // the last rank keeps its local gradient
  local_item_count,         // each rank divides by its own real-item count, not the global one
  fp16_communication,       // gradients rounded to fp16 for the all-reduce (a compression hook)
  reduce_accumulated,       // every_micro_batch: the accumulated buffer re-reduced each time
  fp16_one_rank,            // the last rank alone rounds to fp16 what it sends and what it receives
  once_one_element_short,   // once_per_window: the last bucket's all-reduce leaves its last element out
  reduce_before_ready,      // overlap: a bucket spanning two blocks is all-reduced once its first block's
                            // gradients are final, before the other block has run its backward
  reduce_after_backward,    // overlap: every bucket waits for the end of the backward (no overlap)
  last_block_bucket_late,   // overlap: the last bucket that holds block gradients only waits for the
                            // end of the backward
  deferred_before_ready,    // overlap: as reduce_before_ready, the early all-reduce deferred, so the
                            // other block's backward writes into the bucket while it is reduced
};
const char* dp_fault_name(DpFault f);

struct DpOptions {
  // A bucket closes once it holds this many bytes of gradients or more (PyTorch DDP's
  // bucket_cap_mb, 25 MiB by default): a parameter joins the open bucket, however
  // large. 0: one bucket for every gradient.
  int64_t bucket_bytes = int64_t{25} << 20;
  // All-reduce each bucket inside the backward as soon as its gradients are final
  // (DDP's overlap), rather than after the backward.
  bool overlap = true;
  // Keep a host copy of what this rank sent to the all-reduce (sent(); headroom dump).
  bool record_sent = false;
};

struct DpWindow {
  double local_items = 0;   // real items (tokens, regression outputs) of this rank's slice
  double global_items = 0;  // all-reduced
  int64_t micro_batches = 0;   // on this rank
  int64_t all_reduces = 0;     // gradient all-reduces this window (one per bucket per reduction)
  // of which launched from a block's backward hook, before the backward ended
  // (overlap: every bucket that holds no parameter used outside the blocks), as this
  // step counts them and as the collective library saw them (its calls this window
  // when the last backward ended, earlier micro-batches' included in every_micro_batch
  // mode; 0 for the single engine, which has no library)
  int64_t before_backward_end = 0;
  uint64_t library_calls_before_backward_end = 0;
  // of which deferred: left to run beside the rest of the backward (on a GPU), joined
  // when it ends
  int64_t deferred = 0;
  CommStats comm;              // what this window communicated (gradients and the count)
  CommStats gradients;         // of which the gradient all-reduces
  // The gradient all-reduces as the collective library saw them on this rank
  // (Communicator::library_received): what its receive buffers were given.
  CommStats gradients_received;
};

class DataParallelStep final : private PassHooks {
 public:
  // `global` is the configuration of the whole step: batch = global rows, cut into
  // N slices of batch / N rows, each in micro-batches of micro_batch rows. Every
  // rank builds the same initial parameters (cfg.init_seed).
  DataParallelStep(Device& dev, Communicator& comm, const StepConfig& global, DpSync sync,
                   DpFault fault = DpFault::none, DpOptions options = {});
  ~DataParallelStep() override;
  DataParallelStep(const DataParallelStep&) = delete;
  DataParallelStep& operator=(const DataParallelStep&) = delete;

  // This rank's gradients of the global batch (every rank passes the same batch
  // and takes its slice): all-reduced and divided by the global real-item count,
  // left in the local step's gradient buffers.
  DpWindow reduce_gradients(const Batch& global_batch);

  TrainStep& local() { return *step_; }
  int64_t rows_per_rank() const { return rows_; }
  // once_per_window with record_sent: what this rank sent to the last window's
  // all-reduce, its K micro-batches' plain sums over real items (flat, in parameter order).
  const std::vector<float>& sent() const { return sent_; }
  // The buckets, in the order they are all-reduced: each one's parameter names.
  std::vector<std::vector<std::string>> bucket_parameters() const;
  const DpOptions& options() const { return opt_; }

 private:
  struct Bucket {
    std::vector<size_t> params;    // indices into params().all(), in the bucket's order
    std::vector<int64_t> offsets;  // each one's offset in the flat tensor
    std::vector<int64_t> blocks;   // the blocks whose backward writes its gradients (-1: outside them)
    int64_t elements = 0;
    Tensor flat;  // [elements] fp32, Consumer::gradients: the gradients are views
    Tensor sum;   // every_micro_batch: the reduced micro-batches so far
    bool spans_blocks = false;  // two blocks or more, none of them outside
  };

  void before_pass(bool backward) override;
  void after_pass(bool backward) override;
  void after_block_backward(int64_t block) override;

  bool ready(const Bucket& b) const;
  void launch_ready();
  void reduce(Bucket& b);
  void all_reduce_in_place(Tensor& flat, int64_t count, bool deferred);

  Device* dev_;
  Communicator* comm_;
  StepConfig global_;
  DpSync sync_;
  DpFault fault_;
  DpOptions opt_;
  int64_t rows_ = 0;
  std::unique_ptr<TrainStep> step_;
  std::vector<Bucket> buckets_;
  std::vector<int64_t> flat_offset_;  // each parameter's offset in parameter order (sent())
  int64_t total_elements_ = 0;
  std::vector<float> sent_;
  // Within a reduction: whether this pass reduces, the blocks whose backward has
  // finished, the next bucket to all-reduce.
  int64_t passes_left_ = 0;
  bool reducing_ = false;
  bool in_block_hook_ = false;
  std::vector<bool> block_done_;
  bool outside_done_ = false;
  size_t next_bucket_ = 0;
  size_t last_block_bucket_ = 0;  // the last bucket that holds no parameter used outside the blocks
  uint64_t library_calls_at_start_ = 0;
  DpWindow* window_ = nullptr;
};

// Wrong on purpose (DP-3 controls).
enum class ZeroFault : uint8_t {
  none,
  skip_all_gather,  // each rank keeps only its own shard's update
  shard_one_short,  // every shard stops one element short: N elements are never updated
  whole_state,      // every rank holds (and updates) the moments of every parameter: no sharding
};
const char* zero_fault_name(ZeroFault f);

// ZeRO stage 1: AdamW whose moments are sharded over the ranks. The trainable
// parameters are one flat vector of P elements; rank r owns elements
// [r * ceil(P / N), (r + 1) * ceil(P / N)) (the last shard shorter) and holds m and v
// for those only (Consumer::optimizer_state, so the tracker shows 1 / N). A step
// updates the owned shard from the (already all-reduced) gradients and all-gathers
// the parameters.
class Zero1AdamW {
 public:
  Zero1AdamW(Device& dev, Communicator& comm, ParamSet& params, const ops::AdamWConfig& cfg,
             ZeroFault fault = ZeroFault::none);
  void step(ParamSet& params, int64_t step);
  int64_t total_elements() const { return total_; }
  int64_t shard_elements() const { return shard_; }  // ceil(P / N): the padded shard
  size_t state_bytes() const { return m_.nbytes() + v_.nbytes(); }
  // The moments this rank holds, of the flat elements [state_begin, state_end)
  // (one zero element each when that range is empty).
  const Tensor& exp_avg() const { return m_; }
  const Tensor& exp_avg_sq() const { return v_; }
  int64_t state_begin() const { return state_begin_; }
  int64_t state_end() const { return state_end_; }

 private:
  Device* dev_;
  Communicator* comm_;
  ops::AdamWConfig cfg_;
  ZeroFault fault_;
  int64_t total_ = 0, shard_ = 0, begin_ = 0, end_ = 0;
  int64_t state_begin_ = 0, state_end_ = 0;  // the elements whose moments this rank holds
  Tensor m_, v_;
};

// all_reduce / all_gather of host vectors through any engine: staged through a
// workspace tensor on `dev` when the engine wants device buffers.
void all_reduce_host(Communicator& comm, Device& dev, std::vector<float>& values);
void all_gather_host(Communicator& comm, Device& dev, const std::vector<float>& send, std::vector<float>& recv);

}  // namespace hr::dist
