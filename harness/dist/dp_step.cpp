// The data-parallel step and ZeRO-1 AdamW (see dp_step.hpp).
#include "harness/dist/dp_step.hpp"

#include <algorithm>

#include "harness/check.hpp"
#include "harness/faults.hpp"
#include "kernels/common/float16.hpp"
#include "kernels/elementwise/elementwise.hpp"

namespace hr::dist {

const char* dp_fault_name(DpFault f) {
  switch (f) {
    case DpFault::none: return "none";
    case DpFault::divide_by_n_twice: return "divide_by_n_twice";
    case DpFault::skip_all_reduce_one_rank: return "skip_all_reduce_one_rank";
    case DpFault::local_item_count: return "local_item_count";
    case DpFault::fp16_communication: return "fp16_communication";
    case DpFault::reduce_accumulated: return "reduce_accumulated";
    case DpFault::fp16_one_rank: return "fp16_one_rank";
    case DpFault::once_one_element_short: return "once_one_element_short";
    case DpFault::reduce_before_ready: return "reduce_before_ready";
    case DpFault::reduce_after_backward: return "reduce_after_backward";
    case DpFault::last_block_bucket_late: return "last_block_bucket_late";
    case DpFault::deferred_before_ready: return "deferred_before_ready";
  }
  return "?";
}

const char* zero_fault_name(ZeroFault f) {
  switch (f) {
    case ZeroFault::none: return "none";
    case ZeroFault::skip_all_gather: return "skip_all_gather";
    case ZeroFault::shard_one_short: return "shard_one_short";
    case ZeroFault::whole_state: return "whole_state";
  }
  return "?";
}

void all_reduce_host(Communicator& comm, Device& dev, std::vector<float>& values) {
  if (!comm.device_buffers()) {
    comm.all_reduce_sum(values.data(), values.size(), CommDType::f32);
    return;
  }
  Tensor staged = Tensor::from_host(dev, values, {static_cast<int64_t>(values.size())}, DType::f32, Consumer::workspace);
  comm.all_reduce_sum(staged.data(), values.size(), CommDType::f32);
  comm.synchronize();
  values = staged.to_host_f32();
}

void all_gather_host(Communicator& comm, Device& dev, const std::vector<float>& send, std::vector<float>& recv) {
  recv.assign(send.size() * static_cast<size_t>(comm.size()), 0.f);
  if (!comm.device_buffers()) {
    comm.all_gather(send.data(), recv.data(), send.size(), CommDType::f32);
    return;
  }
  Tensor s = Tensor::from_host(dev, send, {static_cast<int64_t>(send.size())}, DType::f32, Consumer::workspace);
  Tensor r = Tensor::zeros(dev, {static_cast<int64_t>(recv.size())}, DType::f32, Consumer::workspace);
  comm.all_gather(s.data(), r.data(), send.size(), CommDType::f32);
  comm.synchronize();
  recv = r.to_host_f32();
}

namespace {

// The fault path of a compression hook: fp32 values rounded to fp16 in place (on
// the host; a broken variant need not be fast).
void round_to_fp16_in_place(Tensor& t) {
  std::vector<float> v = t.to_host_f32();
  for (float& x : v) x = round_to<half_t>(x);
  t.copy_from(Tensor::from_host(t.device(), v, t.shape(), DType::f32, Consumer::workspace));
}

}  // namespace

DataParallelStep::DataParallelStep(Device& dev, Communicator& comm, const StepConfig& global, DpSync sync,
                                   DpFault fault, DpOptions options)
    : dev_(&dev), comm_(&comm), global_(global), sync_(sync), fault_(faults::armed(fault)), opt_(options) {
  const int64_t n = comm.size();
  HR_ARG_CHECK(global.batch % n == 0, "data parallel: batch {} is not divisible by {} ranks", global.batch, n);
  rows_ = global.batch / n;
  HR_ARG_CHECK(rows_ % global.micro_batch == 0, "data parallel: micro_batch {} does not divide the {} rows per rank",
               global.micro_batch, rows_);
  HR_ARG_CHECK(opt_.bucket_bytes >= 0, "data parallel: a bucket of {} bytes", opt_.bucket_bytes);
  HR_ARG_CHECK(global.precision.grad_accum == DType::f32, "data parallel: gradients accumulate in fp32");
  HR_ARG_CHECK(global.sharding == Sharding::none, "data parallel: sharding {} runs in ShardedStep (sharded_step.hpp)",
               sharding_name(global.sharding));
  const bool overlap_fault = fault_ == DpFault::reduce_before_ready || fault_ == DpFault::reduce_after_backward ||
                             fault_ == DpFault::last_block_bucket_late || fault_ == DpFault::deferred_before_ready;
  HR_ARG_CHECK(!overlap_fault || opt_.overlap, "data parallel: fault {} needs overlap", dp_fault_name(fault_));
  StepConfig local = global;
  local.batch = sync == DpSync::once_per_window ? rows_ : global.micro_batch;
  step_ = std::make_unique<TrainStep>(dev, local);
  // Plain sums over real items; the one division comes after the all-reduce.
  step_->set_loss_divisor(1.0);

  // Buckets in the order the backward finishes the gradients: the blocks from the
  // last to the first (each block's parameters last to first, as DDP fills its
  // buckets from the end of the parameter list), then the parameters used outside
  // the blocks, whose gradients are final only when the whole backward is.
  std::vector<Param>& ps = step_->params().all();
  const std::vector<int64_t> blocks = step_->model().param_blocks();
  const int64_t B = step_->model().num_blocks();
  std::vector<size_t> order;
  for (int64_t b = B - 1; b >= -1; --b)
    for (size_t i = ps.size(); i-- > 0;)
      if (ps[i].grad.defined() && blocks[i] == b) order.push_back(i);
  flat_offset_.assign(ps.size(), -1);
  for (size_t i = 0; i < ps.size(); ++i)
    if (ps[i].grad.defined()) {
      flat_offset_[i] = total_elements_;
      total_elements_ += ps[i].grad.numel();
    }
  for (size_t i : order) {
    if (buckets_.empty() || (opt_.bucket_bytes > 0 && buckets_.back().elements * 4 >= opt_.bucket_bytes))
      buckets_.emplace_back();
    Bucket& b = buckets_.back();
    b.params.push_back(i);
    b.offsets.push_back(b.elements);
    if (std::find(b.blocks.begin(), b.blocks.end(), blocks[i]) == b.blocks.end()) b.blocks.push_back(blocks[i]);
    b.elements += ps[i].grad.numel();
  }
  // The gradients become views into their bucket: the tensors they replace are freed
  // first, so the gradients' peak stays the model's.
  std::vector<Shape> shapes(ps.size());
  for (size_t i = 0; i < ps.size(); ++i)
    if (ps[i].grad.defined()) {
      shapes[i] = ps[i].grad.shape();
      ps[i].grad = Tensor();
    }
  for (Bucket& b : buckets_) {
    b.flat = Tensor::zeros(dev, {b.elements}, DType::f32, Consumer::gradients);
    for (size_t k = 0; k < b.params.size(); ++k) {
      Param& p = ps[b.params[k]];
      const Shape& shape = shapes[b.params[k]];
      p.grad = b.flat.slice(b.offsets[k], b.offsets[k] + shape_numel(shape)).reshape(shape);
    }
  }
  // reduce_before_ready, deferred_before_ready: the buckets that span two blocks or
  // more, all of them blocks (the faults launch those once their first block is done).
  for (size_t k = 0; k < buckets_.size(); ++k) {
    Bucket& b = buckets_[k];
    const bool outside = std::find(b.blocks.begin(), b.blocks.end(), int64_t{-1}) != b.blocks.end();
    b.spans_blocks = b.blocks.size() >= 2 && !outside;
    if (!outside) last_block_bucket_ = k;
  }
  HR_ARG_CHECK((fault_ != DpFault::reduce_before_ready && fault_ != DpFault::deferred_before_ready) ||
                   std::any_of(buckets_.begin(), buckets_.end(), [](const Bucket& b) { return b.spans_blocks; }),
               "data parallel: fault {} needs a bucket that spans two blocks (a smaller bucket cap)",
               dp_fault_name(fault_));
  block_done_.assign(static_cast<size_t>(std::max<int64_t>(B, 0)), false);
  step_->set_pass_hooks(this);
}

DataParallelStep::~DataParallelStep() = default;

std::vector<std::vector<std::string>> DataParallelStep::bucket_parameters() const {
  std::vector<std::vector<std::string>> out;
  const std::vector<Param>& ps = step_->params().all();
  for (const Bucket& b : buckets_) {
    std::vector<std::string>& names = out.emplace_back();
    for (size_t i : b.params) names.push_back(ps[i].name);
  }
  return out;
}

void DataParallelStep::all_reduce_in_place(Tensor& flat, int64_t count, bool deferred) {
  if (comm_->device_buffers() == dev_->is_cuda() || comm_->size() == 1) {
    // Where it lives: host memory for MPI on CPU ranks, device memory for NCCL (the
    // single engine's all-reduce touches nothing).
    if (deferred)
      comm_->all_reduce_sum_deferred(flat.data(), static_cast<size_t>(count), CommDType::f32);
    else
      comm_->all_reduce_sum(flat.data(), static_cast<size_t>(count), CommDType::f32);
    return;
  }
  // A GPU rank under the MPI engine: through the host (elements past count come back
  // as they were).
  std::vector<float> v = flat.to_host_f32();
  comm_->all_reduce_sum(v.data(), static_cast<size_t>(count), CommDType::f32);
  flat.copy_from(Tensor::from_host(*dev_, v, flat.shape(), DType::f32, Consumer::workspace));
}

void DataParallelStep::reduce(Bucket& b) {
  if (opt_.record_sent && sync_ == DpSync::once_per_window) {
    const std::vector<float> v = b.flat.to_host_f32();
    const std::vector<Param>& ps = step_->params().all();
    for (size_t k = 0; k < b.params.size(); ++k)
      std::copy(v.begin() + b.offsets[k], v.begin() + b.offsets[k] + ps[b.params[k]].grad.numel(),
                sent_.begin() + flat_offset_[b.params[k]]);
  }
  const bool last_rank = comm_->rank() == comm_->size() - 1;
  const bool fp16 = fault_ == DpFault::fp16_communication || (fault_ == DpFault::fp16_one_rank && last_rank);
  if (fp16) round_to_fp16_in_place(b.flat);
  int64_t count = b.elements;
  if (fault_ == DpFault::once_one_element_short && sync_ == DpSync::once_per_window && &b == &buckets_.back())
    count = std::max<int64_t>(count - 1, 0);  // the last element stays local
  // Launched from a block's hook, a bucket's all-reduce is deferred: on a GPU it runs
  // beside the rest of the backward, which never touches the bucket again, and the
  // device's work waits for it when the backward ends (after_pass). Not where the
  // bucket is read or replaced right after (every_micro_batch's sum, fp16 rounding, a
  // discarded copy), nor under reduce_before_ready, whose control must reduce the
  // bucket as it was when launched, not whatever the later kernels have added to it
  // by the time the collective reads it.
  const bool deferred = in_block_hook_ && sync_ == DpSync::once_per_window && !fp16 &&
                        fault_ != DpFault::skip_all_reduce_one_rank && fault_ != DpFault::reduce_before_ready;
  if (fault_ == DpFault::skip_all_reduce_one_rank && last_rank) {
    // The collective still runs (the other ranks would wait for it); this rank
    // keeps its own gradient, as a rank that skipped the all-reduce would.
    Tensor discarded = b.flat.clone(Consumer::workspace);
    all_reduce_in_place(discarded, count, false);
  } else {
    all_reduce_in_place(b.flat, count, deferred);
  }
  if (fp16) round_to_fp16_in_place(b.flat);
  if (sync_ == DpSync::every_micro_batch) ops::add(b.sum, b.flat, b.sum);
  ++window_->all_reduces;
  if (in_block_hook_) ++window_->before_backward_end;
  if (deferred) ++window_->deferred;
}

// ---- overlap: the backward's hooks -------------------------------------------------

bool DataParallelStep::ready(const Bucket& b) const {
  const auto done = [&](int64_t block) { return block < 0 ? outside_done_ : block_done_[static_cast<size_t>(block)]; };
  if ((fault_ == DpFault::reduce_before_ready || fault_ == DpFault::deferred_before_ready) && b.spans_blocks)
    return done(b.blocks.front());
  if (fault_ == DpFault::reduce_after_backward ||
      (fault_ == DpFault::last_block_bucket_late && &b == &buckets_[last_block_bucket_]))
    return outside_done_;
  for (int64_t block : b.blocks)
    if (!done(block)) return false;
  return true;
}

void DataParallelStep::launch_ready() {
  // In bucket order only, so that every rank calls the same collectives in the same order.
  while (next_bucket_ < buckets_.size() && ready(buckets_[next_bucket_])) reduce(buckets_[next_bucket_++]);
}

void DataParallelStep::before_pass(bool backward) {
  if (!backward || window_ == nullptr) return;
  // once_per_window: only the window's last backward reduces; every_micro_batch: each.
  reducing_ = opt_.overlap && --passes_left_ == 0;
  std::fill(block_done_.begin(), block_done_.end(), false);
  outside_done_ = false;
  next_bucket_ = 0;
}

void DataParallelStep::after_block_backward(int64_t block) {
  if (!reducing_) return;
  block_done_[static_cast<size_t>(block)] = true;
  in_block_hook_ = true;
  launch_ready();
  in_block_hook_ = false;
}

void DataParallelStep::after_pass(bool backward) {
  if (!backward || !reducing_) return;
  // What the collective library has received so far this window: the buckets launched
  // from the block hooks (counted where the library is entered, not by this step).
  window_->library_calls_before_backward_end = comm_->library_received().calls - library_calls_at_start_;
  // The backward has ended: every gradient is final (a block whose hooks did not
  // run, too).
  outside_done_ = true;
  std::fill(block_done_.begin(), block_done_.end(), true);
  launch_ready();
  HR_CHECK(next_bucket_ == buckets_.size(), "data parallel: {} of {} buckets were all-reduced in the backward",
           next_bucket_, buckets_.size());
  // Every gradient is all-reduced by the time the device's next work runs.
  comm_->join();
  reducing_ = false;
}

DpWindow DataParallelStep::reduce_gradients(const Batch& global_batch) {
  HR_ARG_CHECK(global_batch.rows() == global_.batch, "data parallel: a batch of {} rows, the step takes {}",
               global_batch.rows(), global_.batch);
  const CommStats before = comm_->stats(), received_before = comm_->library_received();
  const auto delta = [](const CommStats& a, const CommStats& b) {
    CommStats d;
    d.calls = a.calls - b.calls;
    d.payload_bytes = a.payload_bytes - b.payload_bytes;
    d.bus_bytes = a.bus_bytes - b.bus_bytes;
    return d;
  };
  DpWindow w;
  window_ = &w;
  struct Reset {
    DataParallelStep* s;
    ~Reset() {
      // A pass that threw may have left a deferred all-reduce running: the buckets are
      // not freed or reused under it (a wait queued, not a host wait).
      try {
        s->comm_->join();
      } catch (...) {  // an aborted communicator: its own error is what the caller sees
      }
      s->window_ = nullptr;
      s->reducing_ = s->in_block_hook_ = false;
      for (Bucket& b : s->buckets_) b.sum = Tensor();  // every_micro_batch's sums, also when a pass threw
    }
  } reset{this};
  library_calls_at_start_ = received_before.calls;
  const Batch mine = global_batch.slice(comm_->rank() * rows_, (comm_->rank() + 1) * rows_);
  const int64_t mb = global_.micro_batch, K = rows_ / mb;
  w.micro_batches = K;
  for (int64_t m = 0; m < K; ++m)
    w.local_items += static_cast<double>(step_->model().loss_items(mine.slice(m * mb, (m + 1) * mb)));
  if (opt_.record_sent) sent_.assign(static_cast<size_t>(total_elements_), 0.f);

  // Without overlap, after the backward: every bucket in order.
  const auto reduce_all = [&] {
    if (opt_.overlap) return;
    for (Bucket& b : buckets_) reduce(b);
  };
  step_->zero_grad();
  // Every bucket once per reducing pass, however it was launched (a hook that did not
  // run would leave the gradients unreduced; every rank counts the same, so all throw).
  const auto check_all_reduced = [&](int64_t passes) {
    HR_CHECK(w.all_reduces == static_cast<int64_t>(buckets_.size()) * passes,
             "data parallel: {} bucket all-reduces in {} passes of {} buckets", w.all_reduces, passes, buckets_.size());
  };
  if (sync_ == DpSync::once_per_window) {
    passes_left_ = K;
    step_->accumulate(mine);
    reduce_all();
    check_all_reduced(1);
  } else {
    for (Bucket& b : buckets_) b.sum = Tensor::zeros(*dev_, {b.elements}, DType::f32, Consumer::gradients);
    for (int64_t m = 0; m < K; ++m) {
      if (fault_ != DpFault::reduce_accumulated) step_->zero_grad();
      passes_left_ = 1;
      step_->accumulate(mine.slice(m * mb, (m + 1) * mb));
      reduce_all();
    }
    check_all_reduced(K);
    for (Bucket& b : buckets_) {
      b.flat.copy_from(b.sum);
      b.sum = Tensor();
    }
  }

  w.gradients = delta(comm_->stats(), before);
  w.gradients_received = delta(comm_->library_received(), received_before);
  // The window's real-item count, all-reduced (integers below 2^24: exact in fp32).
  std::vector<float> items{static_cast<float>(w.local_items)};
  all_reduce_host(*comm_, *dev_, items);
  w.global_items = items[0];
  double divisor = w.global_items;
  if (fault_ == DpFault::divide_by_n_twice) divisor *= comm_->size();
  if (fault_ == DpFault::local_item_count) divisor = w.local_items;
  const float inv = static_cast<float>(1.0 / divisor);
  for (Bucket& b : buckets_) ops::scale(b.flat, inv, b.flat);

  w.comm = delta(comm_->stats(), before);
  return w;
}

// ---- ZeRO-1 ------------------------------------------------------------------------

Zero1AdamW::Zero1AdamW(Device& dev, Communicator& comm, ParamSet& params, const ops::AdamWConfig& cfg,
                       ZeroFault fault)
    : dev_(&dev), comm_(&comm), cfg_(cfg), fault_(faults::armed(fault)) {
  for (const Param& p : params.all())
    if (p.trainable) total_ += p.master.numel();
  const int64_t n = comm.size();
  shard_ = (total_ + n - 1) / n;
  begin_ = std::min(total_, comm.rank() * shard_);
  end_ = std::min(total_, (comm.rank() + 1) * shard_);
  if (fault_ == ZeroFault::shard_one_short && end_ > begin_) --end_;
  state_begin_ = fault_ == ZeroFault::whole_state ? 0 : begin_;
  state_end_ = fault_ == ZeroFault::whole_state ? total_ : end_;
  m_ = Tensor::zeros(dev, {std::max<int64_t>(state_end_ - state_begin_, 1)}, DType::f32, Consumer::optimizer_state);
  v_ = Tensor::zeros(dev, {std::max<int64_t>(state_end_ - state_begin_, 1)}, DType::f32, Consumer::optimizer_state);
}

void Zero1AdamW::step(ParamSet& params, int64_t step) {
  // Flat parameters and gradients (host), in parameter order.
  std::vector<float> flat_p, flat_g;
  struct Segment {
    int64_t begin, end;
    bool decay;
  };
  std::vector<Segment> segments;
  for (const Param& p : params.all()) {
    if (!p.trainable) continue;
    const std::vector<float> pv = p.master.to_host_f32(), gv = p.grad.to_host_f32();
    const int64_t at = static_cast<int64_t>(flat_p.size());
    segments.push_back({at, at + p.master.numel(), p.weight_decay});
    flat_p.insert(flat_p.end(), pv.begin(), pv.end());
    flat_g.insert(flat_g.end(), gv.begin(), gv.end());
  }
  HR_CHECK(static_cast<int64_t>(flat_p.size()) == total_, "Zero1AdamW: {} parameters, built for {}", flat_p.size(), total_);

  // Update the elements whose moments this rank holds (its shard; every element under
  // the whole_state fault), one piece per parameter they overlap (weight decay is per
  // parameter); the owned shard of the result is what the all-gather sends.
  const int64_t sb = state_begin_, se = state_end_, len = se - sb;
  std::vector<float> shard(static_cast<size_t>(shard_), 0.f);
  if (len > 0) {
    auto part = [&](const std::vector<float>& v) { return std::vector<float>(v.begin() + sb, v.begin() + se); };
    Tensor ps = Tensor::from_host(*dev_, part(flat_p), {len}, DType::f32, Consumer::workspace);
    Tensor gs = Tensor::from_host(*dev_, part(flat_g), {len}, DType::f32, Consumer::workspace);
    for (const Segment& s : segments) {
      const int64_t b = std::max(s.begin, sb), e = std::min(s.end, se);
      if (b >= e) continue;
      ops::AdamWConfig c = cfg_;
      if (!s.decay) c.weight_decay = 0.f;
      Tensor p_piece = ps.slice(b - sb, e - sb), g_piece = gs.slice(b - sb, e - sb);
      Tensor m_piece = m_.slice(b - sb, e - sb), v_piece = v_.slice(b - sb, e - sb);
      ops::adamw_step(p_piece, g_piece, m_piece, v_piece, step, c);
    }
    const std::vector<float> updated = ps.to_host_f32();
    if (end_ > begin_)
      std::copy(updated.begin() + (begin_ - sb), updated.begin() + (end_ - sb), shard.begin());
  }

  // Every rank's shard, in rank order; each lands where its owner's range lies.
  std::vector<float> gathered;
  all_gather_host(*comm_, *dev_, shard, gathered);
  for (int q = 0; q < comm_->size(); ++q) {
    if (fault_ == ZeroFault::skip_all_gather && q != comm_->rank()) continue;
    const int64_t b = std::min(total_, q * shard_);
    int64_t e = std::min(total_, (q + 1) * shard_);
    if (fault_ == ZeroFault::shard_one_short && e > b) --e;
    for (int64_t i = b; i < e; ++i) flat_p[static_cast<size_t>(i)] = gathered[static_cast<size_t>(q * shard_ + (i - b))];
  }

  size_t at = 0;
  for (Param& p : params.all()) {
    if (!p.trainable) continue;
    const size_t n = static_cast<size_t>(p.master.numel());
    std::vector<float> part(flat_p.begin() + static_cast<std::ptrdiff_t>(at), flat_p.begin() + static_cast<std::ptrdiff_t>(at + n));
    p.master.copy_from(Tensor::from_host(*dev_, part, p.master.shape(), p.master.dtype(), Consumer::workspace));
    at += n;
  }
  params.sync_compute();
}

}  // namespace hr::dist
