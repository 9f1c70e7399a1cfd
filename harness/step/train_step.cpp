// The composable training step (see train_step.hpp).
#include "harness/step/train_step.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>

#include "harness/check.hpp"
#include "harness/faults.hpp"
#include "harness/models/mlp.hpp"
#include "harness/models/transformer.hpp"
#include "kernels/common/float16.hpp"
#include "kernels/elementwise/elementwise.hpp"
#include "kernels/reduce/reduce.hpp"

namespace hr {

std::unique_ptr<Model> make_model(Device& dev, const StepConfig& cfg) {
  validate(cfg);
  const DType compute = cfg.precision.fault_fp32_activations ? DType::f32 : cfg.precision.compute;
  const ParamStorage storage{compute, cfg.precision.master_weights, cfg.precision.fault_no_master,
                             cfg.adapters.fault_not_frozen, cfg.adapters.fault_b_init_std,
                             cfg.adapters.fault_grad_kept, cfg.adapters.b_init_std};
  const bool lora = cfg.adapters.kind == AdapterKind::lora;
  if (cfg.model == ModelKind::mlp)
    return std::make_unique<MlpModel>(dev, cfg.mlp, storage, cfg.init_seed, lora ? cfg.adapters.rank : 0,
                                      cfg.adapters.alpha);
  return std::make_unique<TransformerModel>(dev, cfg.transformer, storage, cfg.init_seed, lora ? cfg.adapters.rank : 0,
                                            cfg.adapters.alpha);
}

namespace {
std::atomic<int64_t> g_sparse_micro_batches{0};
std::atomic<int64_t> g_fault_runs{0};  // steps built with a repeatability fault
}  // namespace

int64_t sparse_micro_batches() { return g_sparse_micro_batches.load(); }
void note_sparse_micro_batch() { ++g_sparse_micro_batches; }

namespace {
// The configuration a step runs: as given while the fault switches are armed, with
// every switch off while they are disarmed; a switch that changes the compute type
// takes effect here.
StepConfig running_config(const StepConfig& cfg) {
  StepConfig c = faults::armed() ? cfg : without_faults(cfg);
  if (c.precision.fault_compute_fp16) c.precision.compute = DType::f16;
  return c;
}
}  // namespace

TrainStep::TrainStep(Device& dev, const StepConfig& cfg)
    : dev_(&dev), cfg_(running_config(cfg)), scaler_(cfg_.precision.scaler) {
  HR_ARG_CHECK(cfg_.sharding == Sharding::none,
               "sharding: {} shards the step over data-parallel ranks; one process runs none (the sharded step is "
               "harness/dist/sharded_step.hpp, run by headroom-dp)",
               sharding_name(cfg_.sharding));
  model_ = make_model(dev, cfg_);
  optimizer_ = make_optimizer(cfg_.optimizer, model_->params());
  rng_.seed = cfg_.dropout_seed;
  if (cfg_.fault_dropout_key_per_run || cfg_.fault_nondeterministic_ulp) run_index_ = ++g_fault_runs;
  if (cfg_.fault_dropout_key_per_run) rng_.seed += kDropoutPassKeyStep * static_cast<uint64_t>(run_index_);
  rng_.offset = 0;
  rng_.keying = cfg_.dropout_keying;
}

TrainStep::~TrainStep() = default;

void TrainStep::check_batch(const Batch& batch) const {
  HR_ARG_CHECK(batch.rows() == cfg_.batch, "batch: {} rows given, the configuration says batch = {}", batch.rows(),
               cfg_.batch);
  if (cfg_.model == ModelKind::transformer)
    HR_ARG_CHECK(batch.seq_len() <= cfg_.transformer.max_positions,
                 "seq_len: the batch has {} tokens per row, longer than transformer.max_positions {}",
                 batch.seq_len(), cfg_.transformer.max_positions);
}

std::vector<double> TrainStep::micro_counts(const Batch& batch) const {
  const int64_t K = cfg_.accum_steps(), mb = cfg_.micro_batch;
  std::vector<double> items(static_cast<size_t>(K));
  double window = 0;
  for (int64_t m = 0; m < K; ++m) {
    items[static_cast<size_t>(m)] = static_cast<double>(model_->loss_items(batch.slice(m * mb, (m + 1) * mb)));
    window += items[static_cast<size_t>(m)];
    if (cfg_.model == ModelKind::transformer && items[static_cast<size_t>(m)] < static_cast<double>(kMinRealTargets))
      note_sparse_micro_batch();
  }
  // The normaliser's fault: tokens without a target counted as real items.
  const double extra = static_cast<double>(cfg_.fault_extra_loss_items);
  window += extra;
  std::vector<double> counts(static_cast<size_t>(K));
  for (size_t m = 0; m < counts.size(); ++m) {
    if (cfg_.loss_norm == LossNormalization::mean_div_k) items[m] += extra;
    double c = 0;
    switch (cfg_.loss_norm) {
      case LossNormalization::mean_div_k: c = items[m] * static_cast<double>(K); break;
      case LossNormalization::sum_div_window_items: c = window; break;
      case LossNormalization::no_division: c = items[m]; break;
      case LossNormalization::mean_div_k_plus_one: c = items[m] * static_cast<double>(K + 1); break;
      case LossNormalization::sum_div_window_items_plus_one: c = window + 1.0; break;
    }
    if (loss_divisor_ > 0) c = loss_divisor_;
    // A micro-batch without a real item contributes a zero sum: any positive count does.
    counts[m] = c > 0 ? c : 1.0;
  }
  return counts;
}

void TrainStep::zero_grad() {
  if (cfg_.precision.overflow_fault == OverflowFault::keep_last_grad && last_skipped_) {
    // The broken variant: the last trainable tensor keeps the skipped window's gradient.
    Tensor kept;
    for (Param& p : model_->params().all())
      if (p.grad.defined()) kept = p.grad;
    std::vector<float> saved = kept.to_host_f32();
    model_->params().zero_grad();
    kept.copy_from(Tensor::from_host(*dev_, saved, kept.shape(), DType::f32, Consumer::workspace));
  } else {
    model_->params().zero_grad();
  }
  micro_batches_ = 0;
  micro_scales_.clear();
  pending_losses_.clear();
  nonfinite_ = false;
  unscaled_ = false;
}

void TrainStep::accumulate(const Batch& batch) {
  check_batch(batch);
  HR_CHECK(!unscaled_, "accumulate: the gradients were already unscaled for this step; call zero_grad() first");
  const std::vector<double> counts = micro_counts(batch);
  const int64_t mb = cfg_.micro_batch;
  double scale = cfg_.loss_scaling() ? scaler_.scale() : 1.0;
  HR_CHECK(micro_batches_ == 0 || scale == accumulated_scale_ ||
               cfg_.precision.overflow_fault == OverflowFault::backoff_mid_window,
           "accumulate: the loss scale changed ({} -> {}) within one step", accumulated_scale_, scale);
  accumulated_scale_ = scale;
  // per_sample dropout keys: this call's pass, and each micro-batch's first sample.
  rng_.pass = passes_++;
  std::vector<LossValue>& losses = pending_losses_.emplace_back();
  for (size_t m = 0; m < counts.size(); ++m) {
    rng_.sample0 = static_cast<int64_t>(m) * mb;
    const Batch micro = batch.slice(static_cast<int64_t>(m) * mb, static_cast<int64_t>(m + 1) * mb);
    LossSpec ls;
    ls.count = counts[m];
    ls.multiplier = cfg_.loss_multiplier * (m < micro_multipliers_.size() ? micro_multipliers_[m] : 1.0);
    ls.loss_scale = static_cast<float>(scale);
    PassOptions opt;
    opt.checkpoint = cfg_.checkpoint;
    opt.rng = &rng_;
    opt.segment_forward_counts = &segment_counts_;
    opt.kept_label_fault = cfg_.kept_label_fault;
    if (forward_end_hook_) opt.on_forward_end = [this, m] { forward_end_hook_(static_cast<int64_t>(m)); };
    std::vector<std::vector<float>> before;  // the skip_micro_batch fault's copy of the window so far
    if (cfg_.precision.overflow_fault == OverflowFault::skip_micro_batch)
      for (const Param& p : model_->params().all())
        if (p.grad.defined()) before.push_back(p.grad.to_host_f32());
    opt.hooks = hooks_;
    if (hooks_ != nullptr) hooks_->before_pass(true);
    losses.push_back(model_->forward_backward(micro, ls, opt));
    if (hooks_ != nullptr) hooks_->after_pass(true);
    micro_scales_.push_back(static_cast<double>(ls.loss_scale));
    ++micro_batches_;
    if (cfg_.fault_unscale_every_micro_batch && cfg_.loss_scaling()) {
      std::vector<Tensor*> grads;
      for (Param& p : model_->params().all())
        if (p.grad.defined()) grads.push_back(&p.grad);
      (void)ops::unscale_and_check_all(grads, static_cast<float>(1.0 / scale));
    }
    if (cfg_.precision.overflow_fault == OverflowFault::backoff_mid_window && cfg_.loss_scaling()) {
      bool bad = false;
      for (const Param& p : model_->params().all())
        if (p.grad.defined()) bad = ops::any_nonfinite(p.grad) || bad;
      if (bad && scale == scaler_.scale()) {  // the scaler updated here, and the window goes on at its new scale
        scaler_.update(true);
        scale = scaler_.scale();
      }
    }
    if (!before.empty()) {
      bool bad = false;
      for (const Param& p : model_->params().all())
        if (p.grad.defined()) bad = ops::any_nonfinite(p.grad) || bad;
      size_t i = 0;
      if (bad)
        for (Param& p : model_->params().all())
          if (p.grad.defined())
            p.grad.copy_from(Tensor::from_host(*dev_, before[i++], p.grad.shape(), DType::f32, Consumer::workspace));
    }
    if (cfg_.precision.grad_accum != DType::f32) round_gradients_to(cfg_.precision.grad_accum);
  }
}

double TrainStep::take_window_loss() {
  const double loss = window_loss();
  pending_losses_.clear();
  micro_batches_ = 0;
  unscaled_ = false;
  return loss;
}

double TrainStep::window_loss() {
  double window = 0;
  for (const std::vector<LossValue>& group : pending_losses_) {
    double total = 0;
    for (const LossValue& l : group) total += l.value();
    window += total;
  }
  return window;
}

void TrainStep::round_gradients_to(DType buffer) {
  // The gradients stay fp32 tensors; each value is replaced by what a 16-bit buffer
  // would hold after this micro-batch's addition. Each tensor is first scaled by a
  // power of two that puts its largest value near the top of the 16-bit range (as
  // per-tensor scaled low-precision gradients are kept), so what is lost is the
  // rounding of the significand, not underflow; scaling by 2^s is exact. A fault
  // path (docs/catalogue.md POWER), done on the host.
  for (Param& p : model_->params().all()) {
    if (!p.grad.defined()) continue;
    std::vector<float> g = p.grad.to_host_f32();
    float max_abs = 0;
    for (float v : g) max_abs = std::max(max_abs, std::fabs(v));
    if (!(max_abs > 0) || !std::isfinite(max_abs)) continue;
    const int shift = 14 - std::ilogb(max_abs);  // max_abs * 2^shift in [2^14, 2^15)
    for (float& v : g) {
      const float scaled = std::ldexp(v, shift);
      const float rounded = buffer == DType::f16 ? round_to<half_t>(scaled) : round_to<bfloat16_t>(scaled);
      v = std::ldexp(rounded, -shift);
    }
    p.grad.copy_from(Tensor::from_host(*dev_, g, p.grad.shape(), DType::f32, Consumer::workspace));
  }
}

void TrainStep::unscale() {
  if (unscaled_) return;
  unscaled_ = true;
  if (cfg_.fault_nondeterministic_ulp && run_index_ % 2 == 1) {
    // The fault: the first trainable gradient's first element one ulp up.
    for (Param& p : model_->params().all()) {
      if (!p.grad.defined() || p.grad.numel() == 0) continue;
      std::vector<float> g = p.grad.to_host_f32();
      g[0] = std::nextafter(g[0], INFINITY);
      p.grad.copy_from(Tensor::from_host(*dev_, g, p.grad.shape(), DType::f32, Consumer::workspace));
      break;
    }
  }
  // Once per step, after every micro-batch: one pass over each gradient both
  // divides by the scale and looks for inf / NaN.
  nonfinite_ = false;
  if (cfg_.loss_scaling()) {
    const float inv = static_cast<float>(1.0 / accumulated_scale_);
    std::vector<Tensor*> grads;
    for (Param& p : model_->params().all())
      if (p.grad.defined()) grads.push_back(&p.grad);
    nonfinite_ = ops::unscale_and_check_all(grads, inv);
    ++unscale_passes_;
    if (cfg_.fault_unscale_into_fp16)
      for (Tensor* g : grads) {
        Tensor h = Tensor::empty(*dev_, g->shape(), DType::f16, Consumer::workspace);
        ops::cast(*g, h);
        ops::cast(h, *g);
      }
  }
  if (cfg_.checkpoint.enabled() && cfg_.checkpoint.fault_grad_ulp_elements > 0) {
    // The fault, on the unscaled gradients: the first trainable gradient's first
    // non-zero elements one ulp up (a zero gradient, e.g. of a token no row holds,
    // would move to a subnormal that a later scale could flush).
    for (Param& p : model_->params().all()) {
      if (!p.grad.defined() || p.grad.numel() == 0) continue;
      std::vector<float> g = p.grad.to_host_f32();
      int64_t left = cfg_.checkpoint.fault_grad_ulp_elements;
      for (size_t i = 0; i < g.size() && left > 0; ++i)
        if (g[i] != 0.f && std::isfinite(g[i])) {
          g[i] = std::nextafter(g[i], INFINITY);
          --left;
        }
      p.grad.copy_from(Tensor::from_host(*dev_, g, p.grad.shape(), DType::f32, Consumer::workspace));
      break;
    }
  }
}

double TrainStep::forward_backward(const Batch& batch) {
  zero_grad();
  accumulate(batch);
  unscale();
  return window_loss();
}

StepResult TrainStep::apply() {
  StepResult r;
  r.loss_scale = accumulated_scale_;
  r.micro_batches = micro_batches_;
  unscale();
  r.found_nonfinite = nonfinite_;
  if (cfg_.loss_scaling()) scaler_.update(nonfinite_);
  last_skipped_ = nonfinite_ && cfg_.precision.overflow_fault != OverflowFault::no_skip;
  if (last_skipped_) {
    r.skipped = true;
    ++skipped_;
  } else {
    optimizer_->step(model_->params(), cfg_.fault_step_count_frozen ? 1 : applied_ + 1);
    model_->params().sync_compute();
    ++applied_;
  }
  // Read after the optimizer's work is queued: the device goes on with it meanwhile.
  r.loss = window_loss();
  pending_losses_.clear();
  micro_batches_ = 0;
  unscaled_ = false;
  return r;
}

StepResult TrainStep::step(const Batch& batch) {
  zero_grad();
  accumulate(batch);
  return apply();
}

double TrainStep::loss(const Batch& batch) { return forward_only(batch, {}); }

std::vector<float> TrainStep::logits(const Batch& batch) {
  std::vector<float> all;
  forward_only(batch, [&all](const Tensor& l) {
    const std::vector<float> v = l.to_host_f32();
    all.insert(all.end(), v.begin(), v.end());
  });
  HR_ARG_CHECK(!all.empty(), "logits: the {} model has no logits to show", model_->name());
  return all;
}

double TrainStep::forward_only(const Batch& batch, const std::function<void(const Tensor&)>& on_logits) {
  check_batch(batch);
  const std::vector<double> counts = micro_counts(batch);
  const int64_t mb = cfg_.micro_batch;
  std::vector<LossValue> losses;
  rng_.pass = passes_;
  for (size_t m = 0; m < counts.size(); ++m) {
    rng_.sample0 = static_cast<int64_t>(m) * mb;
    LossSpec ls;
    ls.count = counts[m];
    ls.multiplier = cfg_.loss_multiplier;
    PassOptions opt;
    opt.rng = &rng_;
    opt.update_running_stats = false;
    opt.on_logits = on_logits;
    opt.hooks = hooks_;
    if (hooks_ != nullptr) hooks_->before_pass(false);
    losses.push_back(
        model_->forward_loss(batch.slice(static_cast<int64_t>(m) * mb, static_cast<int64_t>(m + 1) * mb), ls, opt));
    if (hooks_ != nullptr) hooks_->after_pass(false);
  }
  double total = 0;  // read once every micro-batch is queued
  for (const LossValue& l : losses) total += l.value();
  return total;
}

const Tensor& TrainStep::grad(const std::string& name) const {
  const Param& p = model_->params().at(name);
  HR_ARG_CHECK(p.grad.defined(), "parameter '{}' is frozen: it has no gradient", name);
  return p.grad;
}

std::vector<std::pair<std::string, Tensor>> TrainStep::gradients() const {
  std::vector<std::pair<std::string, Tensor>> out;
  for (const Param& p : model_->params().all())
    if (p.grad.defined()) out.emplace_back(p.name, p.grad);
  return out;
}

}  // namespace hr
