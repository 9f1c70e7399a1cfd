// The data-parallel step and ZeRO-1 AdamW (see dp_step.hpp).
#include "harness/dist/dp_step.hpp"

#include <algorithm>

#include "harness/check.hpp"
#include "harness/faults.hpp"
#include "kernels/common/float16.hpp"

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

std::vector<float> flat_gradients(TrainStep& step) {
  std::vector<float> flat;
  for (const auto& [name, g] : step.gradients()) {
    const std::vector<float> v = g.to_host_f32();
    flat.insert(flat.end(), v.begin(), v.end());
  }
  return flat;
}

void set_flat_gradients(TrainStep& step, const std::vector<float>& flat) {
  size_t at = 0;
  for (Param& p : step.params().all()) {
    if (!p.grad.defined()) continue;
    const size_t n = static_cast<size_t>(p.grad.numel());
    HR_CHECK(at + n <= flat.size(), "set_flat_gradients: {} values for more gradients", flat.size());
    std::vector<float> part(flat.begin() + static_cast<std::ptrdiff_t>(at), flat.begin() + static_cast<std::ptrdiff_t>(at + n));
    p.grad.copy_from(Tensor::from_host(step.device(), part, p.grad.shape(), DType::f32, Consumer::workspace));
    at += n;
  }
  HR_CHECK(at == flat.size(), "set_flat_gradients: {} values for {} gradient elements", flat.size(), at);
}

DataParallelStep::DataParallelStep(Device& dev, Communicator& comm, const StepConfig& global, DpSync sync,
                                   DpFault fault)
    : dev_(&dev), comm_(&comm), global_(global), sync_(sync), fault_(faults::armed(fault)) {
  const int64_t n = comm.size();
  HR_ARG_CHECK(global.batch % n == 0, "data parallel: batch {} is not divisible by {} ranks", global.batch, n);
  rows_ = global.batch / n;
  HR_ARG_CHECK(rows_ % global.micro_batch == 0, "data parallel: micro_batch {} does not divide the {} rows per rank",
               global.micro_batch, rows_);
  StepConfig local = global;
  local.batch = sync == DpSync::once_per_window ? rows_ : global.micro_batch;
  step_ = std::make_unique<TrainStep>(dev, local);
  // Plain sums over real items; the one division comes after the all-reduce.
  step_->set_loss_divisor(1.0);
}

void DataParallelStep::all_reduce(std::vector<float>& flat) {
  const bool last = comm_->rank() == comm_->size() - 1;
  if (fault_ == DpFault::fp16_communication || (fault_ == DpFault::fp16_one_rank && last))
    for (float& x : flat) x = round_to<half_t>(x);
  if (fault_ == DpFault::skip_all_reduce_one_rank && last) {
    // The collective still runs (the other ranks would wait for it); this rank
    // keeps its own gradient, as a rank that skipped the all-reduce would.
    std::vector<float> discarded = flat;
    all_reduce_host(*comm_, *dev_, discarded);
  } else {
    all_reduce_host(*comm_, *dev_, flat);
  }
  if (fault_ == DpFault::fp16_communication || (fault_ == DpFault::fp16_one_rank && last))
    for (float& x : flat) x = round_to<half_t>(x);
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
  const Batch mine = global_batch.slice(comm_->rank() * rows_, (comm_->rank() + 1) * rows_);
  const int64_t mb = global_.micro_batch, K = rows_ / mb;
  w.micro_batches = K;
  for (int64_t m = 0; m < K; ++m)
    w.local_items += static_cast<double>(step_->model().loss_items(mine.slice(m * mb, (m + 1) * mb)));

  std::vector<float> summed;
  if (sync_ == DpSync::once_per_window) {
    step_->zero_grad();
    step_->accumulate(mine);
    summed = flat_gradients(*step_);
    sent_ = summed;
    if (fault_ == DpFault::once_one_element_short && !summed.empty()) {
      std::vector<float> head(summed.begin(), summed.end() - 1);  // the last element stays local
      all_reduce(head);
      std::copy(head.begin(), head.end(), summed.begin());
    } else {
      all_reduce(summed);
    }
    ++w.all_reduces;
  } else {
    step_->zero_grad();
    for (int64_t m = 0; m < K; ++m) {
      if (fault_ != DpFault::reduce_accumulated) step_->zero_grad();
      step_->accumulate(mine.slice(m * mb, (m + 1) * mb));
      std::vector<float> g = flat_gradients(*step_);
      all_reduce(g);
      ++w.all_reduces;
      if (summed.empty()) summed.assign(g.size(), 0.f);
      for (size_t i = 0; i < g.size(); ++i) summed[i] += g[i];
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
  for (float& x : summed) x *= inv;
  set_flat_gradients(*step_, summed);

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
