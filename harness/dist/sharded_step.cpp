// ZeRO-1/2/3 as one data-parallel step (see sharded_step.hpp).
#include "harness/dist/sharded_step.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <thread>

#include "harness/check.hpp"
#include "harness/faults.hpp"
#include "kernels/common/float16.hpp"
#include "kernels/elementwise/elementwise.hpp"
#include "kernels/optim/optim.hpp"

namespace hr::dist {

const char* shard_fault_name(ShardFault f) {
  switch (f) {
    case ShardFault::none: return "none";
    case ShardFault::drop_rank_contribution: return "drop_rank_contribution";
    case ShardFault::shard_one_short: return "shard_one_short";
    case ShardFault::last_micro_batch_only: return "last_micro_batch_only";
    case ShardFault::gather_reuses_previous: return "gather_reuses_previous";
    case ShardFault::keep_full_gradients: return "keep_full_gradients";
    case ShardFault::all_reduce_gradients: return "all_reduce_gradients";
    case ShardFault::reduce_scatter_one_short: return "reduce_scatter_one_short";
    case ShardFault::fp16_reduce_scatter: return "fp16_reduce_scatter";
    case ShardFault::whole_state: return "whole_state";
  }
  return "?";
}

namespace {

CommStats minus(const CommStats& a, const CommStats& b) {
  CommStats d;
  d.calls = a.calls - b.calls;
  d.payload_bytes = a.payload_bytes - b.payload_bytes;
  d.bus_bytes = a.bus_bytes - b.bus_bytes;
  return d;
}

void add_to(CommStats& into, const CommStats& d) {
  into.calls += d.calls;
  into.payload_bytes += d.payload_bytes;
  into.bus_bytes += d.bus_bytes;
}

// fp32 values through fp16 and back as a compression hook sends a bucket: scaled by
// the power of two that puts its largest magnitude near the top of fp16's range
// (exact), rounded, scaled back; what is lost is the significand's rounding, not
// underflow. A fault path, on the host; a new tensor.
Tensor rounded_to_fp16(const Tensor& x) {
  std::vector<float> v = x.to_host_f32();
  float max_abs = 0;
  for (float e : v) max_abs = std::max(max_abs, std::fabs(e));
  if (max_abs > 0 && std::isfinite(max_abs)) {
    const int shift = 14 - std::ilogb(max_abs);
    for (float& e : v) e = std::ldexp(round_to<half_t>(std::ldexp(e, shift)), -shift);
  }
  return Tensor::from_host(x.device(), v, x.shape(), DType::f32, Consumer::workspace);
}

// A parameter's elements as a view [numel] of a flat tensor, shaped like the parameter.
Tensor view_of(const Tensor& flat, int64_t offset, const Shape& shape) {
  return flat.slice(offset, offset + shape_numel(shape)).reshape(shape);
}

}  // namespace

ShardedStep::ShardedStep(Device& dev, Communicator& comm, const StepConfig& global, ShardFault fault,
                         double collective_delay_s)
    : dev_(&dev),
      comm_(&comm),
      global_(global),
      level_(global.sharding),
      fault_(faults::armed(fault)),
      delay_s_(collective_delay_s) {
  const int64_t n = comm.size();
  HR_ARG_CHECK(level_ != Sharding::none, "sharding: none is the unsharded data-parallel step (DataParallelStep)");
  HR_ARG_CHECK(global.precision.compute == DType::f32 || global.precision.compute == DType::bf16,
               "sharding: {} runs fp32 or bf16 (fp16 needs the loss scaler's unscale and overflow skip, which the "
               "sharded step does not run)",
               sharding_name(level_));
  HR_ARG_CHECK(global.precision.master_weights, "sharding: the sharded step keeps fp32 master weights");
  HR_ARG_CHECK(global.precision.grad_accum == DType::f32, "sharding: gradients accumulate in fp32");
  HR_ARG_CHECK(global.adapters.kind == AdapterKind::none, "sharding: adapters (LoRA) are not sharded");
  HR_ARG_CHECK(global.optimizer.kind == OptimizerKind::adamw || global.optimizer.kind == OptimizerKind::sgd,
               "sharding: the sharded step runs adamw or sgd, not {}", optimizer_kind_name(global.optimizer.kind));
  HR_ARG_CHECK(delay_s_ >= 0 && delay_s_ <= 1, "sharding: a collective delay of {} s (0 to 1)", delay_s_);
  HR_ARG_CHECK(global.batch % n == 0, "sharding: batch {} is not divisible by {} ranks", global.batch, n);
  rows_ = global.batch / n;
  HR_ARG_CHECK(rows_ % global.micro_batch == 0, "sharding: micro_batch {} does not divide the {} rows per rank",
               global.micro_batch, rows_);
  HR_ARG_CHECK(comm.size() == 1 || comm.device_buffers() == dev.is_cuda(),
               "sharding: the {} engine's buffers and the {} device's memory differ", comm.engine(),
               dev.record().name);
  const bool need_zero23 = fault_ == ShardFault::last_micro_batch_only || fault_ == ShardFault::keep_full_gradients;
  HR_ARG_CHECK(!need_zero23 || level_ != Sharding::zero1, "sharding: fault {} needs zero2 or zero3",
               shard_fault_name(fault_));
  HR_ARG_CHECK(fault_ != ShardFault::gather_reuses_previous || level_ == Sharding::zero3,
               "sharding: fault {} needs zero3", shard_fault_name(fault_));

  StepConfig local = global;
  local.batch = rows_;
  local.sharding = Sharding::none;
  local.optimizer = OptimizerConfig{};
  local.optimizer.kind = OptimizerKind::sgd;  // plain SGD holds no state; this step updates the shards itself
  step_ = std::make_unique<TrainStep>(dev, local);
  step_->set_pass_hooks(this);

  // The units: one per block, then the parameters used outside the blocks.
  std::vector<Param>& ps = step_->params().all();
  const std::vector<int64_t> blocks = step_->model().param_blocks();
  const int64_t B = step_->model().num_blocks();
  units_.resize(static_cast<size_t>(B) + 1);
  for (size_t i = 0; i < ps.size(); ++i) {
    if (!ps[i].trainable) continue;
    Unit& u = blocks[i] < 0 ? units_.back() : units_[static_cast<size_t>(blocks[i])];
    u.params.push_back(i);
    u.offsets.push_back(u.elements);
    u.shapes.push_back(ps[i].master.shape());
    u.elements += ps[i].master.numel();
  }
  const bool adamw = global.optimizer.kind == OptimizerKind::adamw;
  for (Unit& u : units_) {
    u.shard = (u.elements + n - 1) / n;
    const int64_t padded = std::max<int64_t>(u.shard * n, 1), shard = std::max<int64_t>(u.shard, 1);
    // Masters: copied into the flat layout, then the parameters' own tensors freed.
    Tensor flat = Tensor::zeros(dev, {padded}, DType::f32, level_ == Sharding::zero3 ? Consumer::workspace : Consumer::weights);
    for (size_t k = 0; k < u.params.size(); ++k) {
      Param& p = ps[u.params[k]];
      view_of(flat, u.offsets[k], p.master.shape()).copy_from(p.master);
    }
    if (level_ == Sharding::zero3) {
      u.master_shard = Tensor::empty(dev, {shard}, DType::f32, Consumer::weights);
      u.master_shard.copy_from(flat.slice(comm.rank() * u.shard, comm.rank() * u.shard + shard));
      for (size_t idx : u.params) ps[idx].master = ps[idx].compute = Tensor();
    } else {
      u.master_flat = flat;
      for (size_t k = 0; k < u.params.size(); ++k) {
        Param& p = ps[u.params[k]];
        const bool shared = p.compute.data() == p.master.data();
        p.master = view_of(flat, u.offsets[k], p.master.shape());
        if (shared) p.compute = p.master;
      }
    }
    flat = Tensor();
    if (level_ == Sharding::zero1) {
      u.grad_flat = Tensor::zeros(dev, {padded}, DType::f32, Consumer::gradients);
      for (size_t k = 0; k < u.params.size(); ++k) {
        Param& p = ps[u.params[k]];
        p.grad = view_of(u.grad_flat, u.offsets[k], p.grad.shape());
      }
    } else {
      for (size_t idx : u.params) ps[idx].grad = Tensor();
    }
    u.grad_shard = Tensor::zeros(dev, {shard}, DType::f32, Consumer::gradients);
    // The optimizer state of the shard (the fault: one element short, so the shard's
    // last element is never updated).
    // Under whole_state, the state of the whole unit (the update reads its first S).
    int64_t state = fault_ == ShardFault::shard_one_short && shard > 1 ? shard - 1 : shard;
    if (fault_ == ShardFault::whole_state) state = padded;
    if (adamw || global.optimizer.sgd.momentum != 0.f)
      u.state_a = Tensor::zeros(dev, {state}, DType::f32, Consumer::optimizer_state);
    if (adamw) u.state_b = Tensor::zeros(dev, {state}, DType::f32, Consumer::optimizer_state);
  }

  if (fault_ == ShardFault::gather_reuses_previous) {
    // The latest block whose parameters are laid out as the next block's: its
    // backward comes right after that block's, and reads that block's buffer.
    auto same_layout = [](const Unit& a, const Unit& b) { return a.elements > 0 && a.shapes == b.shapes; };
    for (int64_t b = B - 2; b >= 0 && stale_unit_ < 0; --b)
      if (same_layout(units_[static_cast<size_t>(b)], units_[static_cast<size_t>(b + 1)])) stale_unit_ = b;
    HR_ARG_CHECK(stale_unit_ >= 0, "sharding: fault gather_reuses_previous needs two blocks of one layout");
  }
}

ShardedStep::~ShardedStep() = default;

int64_t ShardedStep::trainable_elements() const {
  int64_t n = 0;
  for (const Unit& u : units_) n += u.elements;
  return n;
}

int64_t ShardedStep::padded_elements() const {
  int64_t n = 0;
  for (const Unit& u : units_) n += u.shard * comm_->size();
  return n;
}

int64_t ShardedStep::largest_unit_padded() const {
  int64_t n = 0;
  for (size_t i = 0; i + 1 < units_.size(); ++i) n = std::max(n, units_[i].shard * comm_->size());
  return n;
}

void ShardedStep::delay() const {
  if (delay_s_ > 0 && comm_->rank() > 0)
    std::this_thread::sleep_for(std::chrono::duration<double>(delay_s_ * comm_->rank()));
}

template <typename F>
void ShardedStep::counted(CommStats& into, F&& collective) {
  const CommStats before = comm_->stats();
  collective();
  add_to(into, minus(comm_->stats(), before));
}

void ShardedStep::all_gather_tensor(const Tensor& send, Tensor& recv) {
  // One rank on a device whose memory the engine does not take: a copy.
  if (comm_->size() == 1 && comm_->device_buffers() != dev_->is_cuda()) {
    recv.slice(0, send.numel()).copy_from(send);
    return;
  }
  delay();
  if (send.dtype() == DType::f32)
    comm_->all_gather(send.data(), recv.data(), static_cast<size_t>(send.numel()), CommDType::f32);
  else  // a copy: 16-bit values travel as their bytes
    comm_->all_gather(send.data(), recv.data(), send.nbytes(), CommDType::u8);
}

void ShardedStep::reduce_scatter_tensor(const Tensor& send, Tensor& recv) {
  if (comm_->size() == 1 && comm_->device_buffers() != dev_->is_cuda()) {
    recv.copy_from(send.slice(0, recv.numel()));
    return;
  }
  delay();
  comm_->reduce_scatter_sum(send.data(), recv.data(), static_cast<size_t>(recv.numel()), CommDType::f32);
}

// ---- zero3: the parameters, gathered per unit -----------------------------------------

// Every rank's shard of the masters, in the compute dtype (each rank rounds its own:
// the gathered values are the rounded whole), into recv [N S].
void ShardedStep::gather_into(Unit& u, Tensor& recv) {
  Tensor send = u.master_shard;
  if (recv.dtype() != DType::f32) {
    send = Tensor::empty(*dev_, u.master_shard.shape(), recv.dtype(), Consumer::workspace);
    ops::cast(u.master_shard, send);
  }
  counted(current_.parameters, [&] { all_gather_tensor(send, recv); });
}

void ShardedStep::bind_compute(Unit& u, const Tensor& flat) {
  std::vector<Param>& ps = step_->params().all();
  for (size_t k = 0; k < u.params.size(); ++k) ps[u.params[k]].compute = view_of(flat, u.offsets[k], u.shapes[k]);
}

void ShardedStep::gather(Unit& u) {
  if (u.elements == 0 || u.gathered.defined()) return;
  u.gathered = Tensor::empty(*dev_, {u.shard * comm_->size()}, global_.precision.compute, Consumer::weights);
  gather_into(u, u.gathered);
  bind_compute(u, u.gathered);
}

void ShardedStep::release_gathered(Unit& u) {
  std::vector<Param>& ps = step_->params().all();
  for (size_t idx : u.params) ps[idx].compute = Tensor();
  u.gathered = Tensor();
}

// ---- zero2/zero3: the gradients, reduced per unit ------------------------------------

void ShardedStep::open_gradients(Unit& u) {
  if (u.elements == 0 || level_ == Sharding::zero1) return;
  if (!u.grad_flat.defined()) u.grad_flat = Tensor::zeros(*dev_, {u.shard * comm_->size()}, DType::f32, Consumer::gradients);
  else u.grad_flat.zero_();  // a kept buffer (keep_* faults)
  std::vector<Param>& ps = step_->params().all();
  for (size_t k = 0; k < u.params.size(); ++k) ps[u.params[k]].grad = view_of(u.grad_flat, u.offsets[k], u.shapes[k]);
}

void ShardedStep::reduce_gradients(Unit& u, bool add) {
  if (u.elements == 0) return;
  Tensor send = u.grad_flat;
  if (fault_ == ShardFault::drop_rank_contribution && comm_->rank() == comm_->size() - 1 && comm_->size() > 1) {
    send = Tensor::zeros(*dev_, u.grad_flat.shape(), DType::f32, Consumer::workspace);
  }
  if (fault_ == ShardFault::fp16_reduce_scatter) send = rounded_to_fp16(send);
  Tensor reduced = add ? Tensor::zeros(*dev_, u.grad_shard.shape(), DType::f32, Consumer::workspace) : u.grad_shard;
  if (fault_ == ShardFault::all_reduce_gradients) {
    // The whole gradient, summed on every rank, of which each keeps its shard.
    Tensor whole = send.clone(Consumer::workspace);
    counted(current_.gradients, [&] {
      delay();
      comm_->all_reduce_sum(whole.data(), static_cast<size_t>(whole.numel()), CommDType::f32);
    });
    reduced.copy_from(whole.slice(comm_->rank() * u.shard, (comm_->rank() + 1) * u.shard));
  } else if (fault_ == ShardFault::reduce_scatter_one_short && &u == &root() && u.shard > 1) {
    // The fault: each rank's block of the reduce-scatter one element short (the
    // blocks shift, and each rank's last element is left as it was).
    Tensor part = reduced.slice(0, u.shard - 1);
    counted(current_.gradients, [&] { reduce_scatter_tensor(send.slice(0, (u.shard - 1) * comm_->size()), part); });
  } else {
    counted(current_.gradients, [&] { reduce_scatter_tensor(send, reduced); });
  }
  if (add) ops::add(u.grad_shard, reduced, u.grad_shard);
}

void ShardedStep::close_gradients(Unit& u) {
  if (u.elements == 0) return;
  const bool last_only = fault_ == ShardFault::last_micro_batch_only;
  reduce_gradients(u, !last_only);
  std::vector<Param>& ps = step_->params().all();
  for (size_t idx : u.params) ps[idx].grad = Tensor();
  if (fault_ != ShardFault::keep_full_gradients) u.grad_flat = Tensor();
}

// ---- the hooks ----------------------------------------------------------------------

void ShardedStep::before_pass(bool backward) {
  if (level_ == Sharding::zero3) gather(root());
  if (backward) open_gradients(root());
}

void ShardedStep::after_pass(bool backward) {
  if (backward && level_ != Sharding::zero1) close_gradients(root());
  if (level_ == Sharding::zero3) release_gathered(root());
  if (stale_.defined()) stale_ = Tensor();
}

void ShardedStep::before_block_forward(int64_t block) {
  if (level_ != Sharding::zero3) return;
  gather(units_[static_cast<size_t>(block)]);
}

void ShardedStep::after_block_forward(int64_t block) {
  if (level_ == Sharding::zero3) release_gathered(units_[static_cast<size_t>(block)]);
}

void ShardedStep::before_block_backward(int64_t block) {
  Unit& u = units_[static_cast<size_t>(block)];
  if (level_ == Sharding::zero3) {
    if (block == stale_unit_ && stale_.defined()) {
      // The fault: no gather; the parameters are read from the buffer the block
      // after this one was gathered into, which was never freed.
      bind_compute(u, stale_);
      u.gathered = stale_;
    } else {
      gather(u);
    }
  }
  open_gradients(u);
}

void ShardedStep::after_block_backward(int64_t block) {
  Unit& u = units_[static_cast<size_t>(block)];
  if (level_ != Sharding::zero1) close_gradients(u);
  if (level_ == Sharding::zero3) {
    if (stale_unit_ >= 0 && block == stale_unit_ + 1) stale_ = u.gathered;
    release_gathered(u);
  }
}

// ---- the step -----------------------------------------------------------------------

void ShardedStep::update(Unit& u) {
  if (u.elements == 0) return;
  const int64_t r = comm_->rank(), begin = std::min(u.elements, r * u.shard);
  int64_t end = std::min(u.elements, (r + 1) * u.shard);
  if (u.state_a.defined()) end = std::min(end, r * u.shard + std::min(u.state_a.numel(), u.shard));  // one short under the fault
  if (end <= begin) return;
  Tensor params = level_ == Sharding::zero3 ? u.master_shard : u.master_flat.slice(r * u.shard, (r + 1) * u.shard);
  const std::vector<Param>& ps = step_->params().all();
  const bool adamw = global_.optimizer.kind == OptimizerKind::adamw;
  // One piece per parameter the shard overlaps (weight decay is per parameter).
  for (size_t k = 0; k < u.params.size(); ++k) {
    const Param& p = ps[u.params[k]];
    const int64_t b = std::max(u.offsets[k], begin), e = std::min(u.offsets[k] + shape_numel(u.shapes[k]), end);
    if (b >= e) continue;
    const int64_t lo = b - r * u.shard, hi = e - r * u.shard;
    Tensor pp = params.slice(lo, hi), gp = u.grad_shard.slice(lo, hi);
    if (adamw) {
      ops::AdamWConfig c = global_.optimizer.adamw;
      if (!p.weight_decay) c.weight_decay = 0.f;
      Tensor m = u.state_a.slice(lo, hi), v = u.state_b.slice(lo, hi);
      ops::adamw_step(pp, gp, m, v, applied_ + 1, c);
    } else {
      ops::SgdConfig c = global_.optimizer.sgd;
      if (!p.weight_decay) c.weight_decay = 0.f;
      Tensor m = u.state_a.defined() ? u.state_a.slice(lo, hi) : Tensor();
      ops::sgd_step(pp, gp, m, c);
    }
  }
}

void ShardedStep::all_gather_masters(Unit& u) {
  if (u.elements == 0) return;
  const int64_t r = comm_->rank();
  Tensor send = u.master_flat.slice(r * u.shard, (r + 1) * u.shard).clone(Consumer::workspace);
  counted(current_.parameters, [&] { all_gather_tensor(send, u.master_flat); });
  std::vector<Param>& ps = step_->params().all();
  for (size_t idx : u.params) {
    Param& p = ps[idx];
    if (p.compute.data() != p.master.data()) ops::cast(p.master, p.compute);
  }
}

ShardedStepResult ShardedStep::step(const Batch& global_batch) {
  HR_ARG_CHECK(global_batch.rows() == global_.batch, "sharding: a batch of {} rows, the step takes {}",
               global_batch.rows(), global_.batch);
  current_ = ShardedStepResult{};
  const Batch mine = global_batch.slice(comm_->rank() * rows_, (comm_->rank() + 1) * rows_);
  const int64_t mb = global_.micro_batch, K = rows_ / mb;
  current_.micro_batches = K;
  double local_items = 0;
  for (int64_t m = 0; m < K; ++m)
    local_items += static_cast<double>(step_->model().loss_items(mine.slice(m * mb, (m + 1) * mb)));

  // The window's real-item count, summed over ranks first (fp64: exact), so that every
  // micro-batch's loss is divided by it inside its own backward: the gradients come
  // out in real units, each loss gradient rounded (16-bit) as the single process
  // rounds it, and no division follows.
  auto all_reduce_f64 = [&](double v) {
    double x = v;
    counted(current_.other, [&] {
      if (comm_->device_buffers()) {
        Tensor t = Tensor::empty(*dev_, {2}, DType::f32, Consumer::workspace);
        t.from_host_bytes(&x, sizeof x);
        comm_->all_reduce_sum(t.data(), 1, CommDType::f64);
        comm_->synchronize();
        const std::vector<uint8_t> bytes = t.to_host_bytes();
        std::memcpy(&x, bytes.data(), sizeof x);
      } else {
        comm_->all_reduce_sum(&x, 1, CommDType::f64);
      }
    });
    return x;
  };
  current_.global_items = all_reduce_f64(local_items);
  HR_CHECK(current_.global_items > 0, "sharding: the batch holds no real item");
  step_->set_loss_divisor(current_.global_items);

  for (Unit& u : units_) u.grad_shard.zero_();
  step_->zero_grad();  // zero1's full gradients
  step_->accumulate(mine);
  if (level_ == Sharding::zero1)
    for (Unit& u : units_) reduce_gradients(u, false);
  current_.loss = all_reduce_f64(step_->take_window_loss());

  for (Unit& u : units_) update(u);
  ++applied_;
  if (level_ != Sharding::zero3)
    for (Unit& u : units_) all_gather_masters(u);
  return current_;
}

std::vector<std::pair<std::string, std::vector<float>>> ShardedStep::parameters() {
  std::vector<std::pair<std::string, std::vector<float>>> out;
  const std::vector<Param>& ps = step_->params().all();
  std::vector<std::vector<float>> by_param(ps.size());
  for (Unit& u : units_) {
    if (u.elements == 0) continue;
    std::vector<float> flat;
    if (level_ == Sharding::zero3) {
      Tensor whole = Tensor::empty(*dev_, {u.shard * comm_->size()}, DType::f32, Consumer::workspace);
      all_gather_tensor(u.master_shard, whole);
      flat = whole.to_host_f32();
    } else {
      flat = u.master_flat.to_host_f32();
    }
    for (size_t k = 0; k < u.params.size(); ++k)
      by_param[u.params[k]].assign(flat.begin() + u.offsets[k], flat.begin() + u.offsets[k] + shape_numel(u.shapes[k]));
  }
  for (size_t i = 0; i < ps.size(); ++i)
    if (ps[i].trainable) out.emplace_back(ps[i].name, std::move(by_param[i]));
  return out;
}

}  // namespace hr::dist
