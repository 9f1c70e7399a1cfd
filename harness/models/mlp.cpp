// The controlled MLP's forward and backward passes (see mlp.hpp). Kept tensors
// are Consumer::activations when a block keeps state, workspace otherwise;
// activation gradients are workspace and released as soon as used.
#include "harness/models/mlp.hpp"

#include <algorithm>
#include <cmath>

#include "harness/check.hpp"
#include "kernels/batchnorm/batchnorm.hpp"
#include "kernels/crossentropy/crossentropy.hpp"
#include "kernels/dropout/dropout.hpp"
#include "kernels/elementwise/elementwise.hpp"
#include "kernels/gelu/gelu.hpp"
#include "kernels/layernorm/layernorm.hpp"
#include "kernels/matmul/matmul.hpp"
#include "kernels/mse/mse.hpp"

namespace hr {
namespace {

// Fault (MlpConfig::fault_ln_batch_leak): h <- (1 - a) h + a * (h's mean row), so
// what LayerNorm then normalises per row depends on the other rows of the batch.
void leak_batch_mean(Tensor& h, float a) {
  Tensor mean_row = Tensor::zeros(h.device(), {h.dim(1)}, DType::f32, Consumer::workspace);
  ops::bias_grad(h, mean_row);  // column sums
  ops::scale(mean_row, a / static_cast<float>(h.dim(0)), mean_row);
  ops::scale(h, 1.f - a, h);
  ops::add_bias(h, mean_row);
}

}  // namespace

struct MlpModel::State final : BlockState {
  Tensor x;             // block input [N, in]
  Tensor h;             // linear out [N, W]
  Tensor n;             // norm out [N, W] (undefined without a norm)
  Tensor mean, rstd;    // LayerNorm fp32 [N]; BatchNorm fp32 [chunks, W]
  DropoutDraw drop;  // replays the block's mask
};

MlpModel::MlpModel(Device& dev, const MlpConfig& cfg, ParamStorage storage, uint64_t seed, int64_t lora_rank,
                   float lora_alpha)
    : Model(ParamSet(dev, storage, seed)), cfg_(cfg), dtype_(storage.compute), lora_rank_(lora_rank) {
  HR_ARG_CHECK(lora_rank == 0 || cfg.norm != NormKind::batchnorm, "adapters: LoRA on the MLP needs norm none or layernorm");
  if (lora_rank > 0) lora_scale_ = lora_alpha / static_cast<float>(lora_rank);
  params_.set_add_frozen(lora_rank > 0);
  for (int64_t l = 0; l < cfg.layers; ++l) {
    const int64_t in = l == 0 ? cfg.in_dim : cfg.width;
    const int64_t out = l + 1 == cfg.layers ? cfg.out_dim : cfg.width;
    const float bound = 1.f / std::sqrt(static_cast<float>(in));
    params_.add_uniform(fmt::format("layers.{}.weight", l), {out, in}, bound, true);
    w_.push_back(static_cast<int>(params_.size() - 1));
    params_.add_uniform(fmt::format("layers.{}.bias", l), {out}, bound, false);
    b_.push_back(static_cast<int>(params_.size() - 1));
  }
  for (int64_t l = 0; l + 1 < cfg.layers; ++l) {
    if (cfg.norm == NormKind::none) {
      gamma_.push_back(-1);
      beta_.push_back(-1);
      continue;
    }
    params_.add_const(fmt::format("norms.{}.weight", l), {cfg.width}, 1.f);
    gamma_.push_back(static_cast<int>(params_.size() - 1));
    params_.add_const(fmt::format("norms.{}.bias", l), {cfg.width}, 0.f);
    beta_.push_back(static_cast<int>(params_.size() - 1));
    if (cfg.norm == NormKind::batchnorm) {
      // Model state, not trained: charged to weights.
      running_mean_.push_back(Tensor::zeros(dev, {cfg.width}, DType::f32, Consumer::weights));
      running_var_.push_back(Tensor::from_host(dev, std::vector<float>(static_cast<size_t>(cfg.width), 1.f),
                                               {cfg.width}, DType::f32, Consumer::weights));
    }
  }
  params_.set_add_frozen(false);
  if (lora_rank > 0)
    for (int64_t l = 0; l + 1 < cfg.layers; ++l) {
      const int64_t in = l == 0 ? cfg.in_dim : cfg.width;
      params_.add_uniform(fmt::format("layers.{}.lora_A", l), {lora_rank, in}, 1.f / std::sqrt(static_cast<float>(in)));
      la_.push_back(static_cast<int>(params_.size() - 1));
      params_.add_lora_b(fmt::format("layers.{}.lora_B", l), {cfg.width, lora_rank});
      lb_.push_back(static_cast<int>(params_.size() - 1));
    }
}

std::vector<std::pair<std::string, Tensor>> MlpModel::buffers() const {
  std::vector<std::pair<std::string, Tensor>> out;
  for (size_t l = 0; l < running_mean_.size(); ++l) {
    out.emplace_back(fmt::format("norms.{}.running_mean", l), running_mean_[l]);
    out.emplace_back(fmt::format("norms.{}.running_var", l), running_var_[l]);
  }
  return out;
}

int64_t MlpModel::loss_items(const Batch& mb) const {
  if (cfg_.task == MlpTask::regression) return mb.targets_f32.numel();
  return ops::count_real_tokens(mb.targets, -100, mb.host_targets());
}

int64_t MlpModel::virtual_batch(int64_t rows) const {
  if (cfg_.bn_virtual_batch <= 0 || cfg_.bn_virtual_batch >= rows) return rows;
  HR_ARG_CHECK(rows % cfg_.bn_virtual_batch == 0, "bn_virtual_batch: {} does not divide the micro-batch of {} rows",
               cfg_.bn_virtual_batch, rows);
  return cfg_.bn_virtual_batch;
}

Tensor MlpModel::block_forward(int64_t i, const Tensor& x, bool keep, bool recompute, Consumer out_consumer,
                               DropoutStream& rng, std::unique_ptr<BlockState>* state) {
  Device& dev = x.device();
  const size_t l = static_cast<size_t>(i);
  const int64_t N = x.dim(0), W = cfg_.width;
  const Consumer a = keep ? Consumer::activations : Consumer::workspace;
  // MEM-1's negative controls charge kept tensors to workspace (StepConfig::kept_label_fault).
  const Consumer stats_c = label_fault_ == KeptLabelFault::norm_stats ? Consumer::workspace : a;
  const Consumer h_c = label_fault_ == KeptLabelFault::block_hidden ? Consumer::workspace : a;
  count_block_forward(i);
  auto st = std::make_unique<State>();
  st->x = x;
  st->h = Tensor::empty(dev, {N, W}, dtype_, h_c);
  ops::linear_forward(x, P(w_[l]).compute, P(b_[l]).compute, st->h);
  if (lora_rank_ > 0) {  // h += scale (x A^T) B^T
    Tensor u = Tensor::empty(dev, {N, lora_rank_}, dtype_, Consumer::workspace);
    ops::linear_forward(x, P(la_[l]).compute, Tensor(), u);
    ops::scale(u, lora_scale_, u);
    Tensor d = Tensor::empty(dev, {N, W}, dtype_, Consumer::workspace);
    ops::linear_forward(u, P(lb_[l]).compute, Tensor(), d);
    u = Tensor();
    ops::add(st->h, d, st->h);
  }
  Tensor gelu_in = st->h;
  if (cfg_.norm == NormKind::layernorm) {
    if (cfg_.fault_ln_batch_leak != 0.f) leak_batch_mean(st->h, cfg_.fault_ln_batch_leak);
    st->n = Tensor::empty(dev, {N, W}, dtype_, a);
    st->mean = Tensor::empty(dev, {N}, DType::f32, stats_c);
    st->rstd = Tensor::empty(dev, {N}, DType::f32, stats_c);
    ops::layernorm_forward(st->h, P(gamma_[l]).compute, P(beta_[l]).compute, cfg_.norm_eps, st->n, st->mean,
                           st->rstd);
    gelu_in = st->n;
  } else if (cfg_.norm == NormKind::batchnorm) {
    const int64_t vb = virtual_batch(N), chunks = N / vb;
    if (chunks > 1 && cfg_.fault_ghost_bn_neighbour_leak != 0.f) {
      // Fault: virtual batch c normalises h_c + leak (h_{c+1} - h_c) (the last wraps to 0).
      // The difference is formed in fp32, so the mix rounds once into the compute dtype.
      Tensor mixed = st->h.clone(a);
      Tensor diff = Tensor::empty(dev, {vb, W}, DType::f32, Consumer::workspace);
      for (int64_t c = 0; c < chunks; ++c) {
        Tensor m_c = mixed.slice(c * vb, (c + 1) * vb);
        const int64_t next = (c + 1) % chunks;
        ops::cast(st->h.slice(next * vb, (next + 1) * vb), diff);
        ops::axpy(-1.f, st->h.slice(c * vb, (c + 1) * vb), diff);
        ops::axpy(cfg_.fault_ghost_bn_neighbour_leak, diff, m_c);
      }
      st->h = mixed;
    }
    st->n = Tensor::empty(dev, {N, W}, dtype_, a);
    st->mean = Tensor::empty(dev, {chunks, W}, DType::f32, stats_c);
    st->rstd = Tensor::empty(dev, {chunks, W}, DType::f32, stats_c);
    // A recompute (or a pass told not to) must leave the running statistics as
    // they are: it normalises with the same batch statistics into scratch copies.
    const bool update = update_stats_ && (!recompute || bn_update_on_recompute_);
    Tensor rm = update ? running_mean_[l] : running_mean_[l].clone(Consumer::workspace);
    Tensor rv = update ? running_var_[l] : running_var_[l].clone(Consumer::workspace);
    for (int64_t c = 0; c < chunks; ++c) {
      Tensor n_c = st->n.slice(c * vb, (c + 1) * vb), m_c = st->mean.slice(c, c + 1).reshape({W}),
             r_c = st->rstd.slice(c, c + 1).reshape({W});
      ops::batchnorm_forward_train(st->h.slice(c * vb, (c + 1) * vb), P(gamma_[l]).compute, P(beta_[l]).compute,
                                   cfg_.norm_eps, cfg_.bn_momentum, rm, rv, n_c, m_c, r_c);
    }
    // Fault (MlpConfig::fault_bn_recompute_channels): the recompute's update of the
    // first channels reaches the real running statistics.
    const int64_t touched = std::min(W, cfg_.fault_bn_recompute_channels);
    if (recompute && update_stats_ && !update && touched > 0) {
      running_mean_[l].slice(0, touched).copy_from(rm.slice(0, touched));
      running_var_[l].slice(0, touched).copy_from(rv.slice(0, touched));
    }
    gelu_in = st->n;
  }
  Tensor out = Tensor::empty(dev, {N, W}, dtype_, out_consumer);
  // One sample per row.
  if (cfg_.dropout > 0.f) {  // a site with p = 0 draws nothing: no offset advanced, nothing logged
    st->drop = rng.take(i, DropoutSite::hidden, {N, W}, N);
    Tensor g = Tensor::empty(dev, {N, W}, dtype_, Consumer::workspace);
    ops::gelu_forward(gelu_in, g);
    dropout_apply_forward(st->drop, cfg_.dropout, g, out);
  } else {
    ops::gelu_forward(gelu_in, out);
  }
  if (keep) *state = std::move(st);
  return out;
}

Tensor MlpModel::block_backward(int64_t i, BlockState& state, const Tensor& dy, bool need_dx) {
  auto& st = static_cast<State&>(state);
  Device& dev = dy.device();
  const size_t l = static_cast<size_t>(i);
  const int64_t N = dy.dim(0), W = cfg_.width;
  const Consumer ws = Consumer::workspace;
  Tensor dg = dy;
  if (cfg_.dropout > 0.f) {
    dg = Tensor::empty(dev, {N, W}, dtype_, ws);
    dropout_apply_backward(st.drop, cfg_.dropout, dy, dg);
  }
  Tensor dn = Tensor::empty(dev, {N, W}, dtype_, ws);
  ops::gelu_backward(cfg_.norm == NormKind::none ? st.h : st.n, dg, dn);
  dg = Tensor();
  Tensor dh = dn;
  if (cfg_.norm == NormKind::layernorm) {
    dh = Tensor::empty(dev, {N, W}, dtype_, ws);
    if (P(gamma_[l]).grad.defined()) {
      ops::layernorm_backward(dn, st.h, P(gamma_[l]).compute, st.mean, st.rstd, dh, P(gamma_[l]).grad,
                              P(beta_[l]).grad);
    } else {  // frozen (LoRA): the kernel's parameter gradients go to temporaries
      Tensor dgamma = Tensor::zeros(dev, {W}, DType::f32, ws), dbeta = Tensor::zeros(dev, {W}, DType::f32, ws);
      ops::layernorm_backward(dn, st.h, P(gamma_[l]).compute, st.mean, st.rstd, dh, dgamma, dbeta);
    }
  } else if (cfg_.norm == NormKind::batchnorm) {
    dh = Tensor::empty(dev, {N, W}, dtype_, ws);
    const int64_t chunks = st.mean.dim(0), vb = N / chunks;
    for (int64_t c = 0; c < chunks; ++c) {
      Tensor dh_c = dh.slice(c * vb, (c + 1) * vb);
      ops::batchnorm_backward(dn.slice(c * vb, (c + 1) * vb), st.h.slice(c * vb, (c + 1) * vb),
                              P(gamma_[l]).compute, st.mean.slice(c, c + 1).reshape({W}),
                              st.rstd.slice(c, c + 1).reshape({W}), dh_c, P(gamma_[l]).grad, P(beta_[l]).grad);
    }
  }
  dn = Tensor();
  st.n = st.mean = st.rstd = Tensor();
  Tensor dx;
  if (need_dx) dx = Tensor::empty(dev, {N, st.x.dim(1)}, dtype_, ws);
  ops::linear_backward(st.x, P(w_[l]).compute, dh, dx, P(w_[l]).grad, P(b_[l]).grad);
  if (lora_rank_ > 0) {  // B's and A's gradients; dx += the adapter path's share
    Tensor no_bias;
    Tensor u = Tensor::empty(dev, {N, lora_rank_}, dtype_, ws);  // recomputed, not kept
    ops::linear_forward(st.x, P(la_[l]).compute, Tensor(), u);
    ops::scale(u, lora_scale_, u);
    Tensor du = Tensor::empty(dev, {N, lora_rank_}, dtype_, ws);
    ops::linear_backward(u, P(lb_[l]).compute, dh, du, P(lb_[l]).grad, no_bias);
    u = Tensor();
    ops::scale(du, lora_scale_, du);
    ops::linear_backward(st.x, P(la_[l]).compute, du, dx, P(la_[l]).grad, no_bias, ops::DxWrite::accumulate);
  }
  st.x = st.h = Tensor();
  return dx;
}

LossValue MlpModel::run(const Batch& mb, const LossSpec& loss, PassOptions& opt, bool backward) {
  HR_CHECK(opt.rng != nullptr, "mlp: PassOptions.rng is required");
  HR_ARG_CHECK(mb.x.defined(), "mlp batch needs x");
  HR_ARG_CHECK(mb.x.dim(1) == cfg_.in_dim, "mlp batch x has {} features, the model takes in_dim = {}", mb.x.dim(1),
               cfg_.in_dim);
  Device& dev = params_.device();
  const int64_t N = mb.x.dim(0), L = cfg_.layers;
  update_stats_ = opt.update_running_stats;
  bn_update_on_recompute_ = opt.checkpoint.update_bn_stats_on_recompute;
  label_fault_ = backward ? opt.kept_label_fault : KeptLabelFault::none;
  const Consumer a = backward ? Consumer::activations : Consumer::workspace;

  Tensor x0 = Tensor::empty(dev, {N, cfg_.in_dim}, dtype_, a);
  ops::cast(mb.x, x0);
  CheckpointPolicy policy = opt.checkpoint;
  // Forward only: a single checkpointed segment that is never run backward keeps nothing.
  if (!backward) policy.every_k_blocks = int64_t{1} << 40;
  CheckpointedStack stack(*this, policy, opt.hooks);
  Tensor xL = stack.forward(x0, *opt.rng);

  const size_t last = static_cast<size_t>(L - 1);
  Tensor pred = Tensor::empty(dev, {N, cfg_.out_dim}, dtype_, a);
  ops::linear_forward(xL, P(w_[last]).compute, P(b_[last]).compute, pred);
  const double count = loss.count / loss.multiplier;
  LossValue value;
  Tensor dpred;
  if (cfg_.task == MlpTask::regression) {
    HR_ARG_CHECK(mb.targets_f32.defined(), "mlp regression batch needs targets_f32");
    ops::MseConfig mc;
    mc.reduction = ops::LossReduction::sum_div_count;
    mc.count = count;
    mc.loss_scale = loss.loss_scale;
    value = ops::mse_forward(pred, mb.targets_f32, mc);
    if (!backward) return value;
    if (opt.on_forward_end) opt.on_forward_end();
    dpred = Tensor::empty(dev, pred.shape(), dtype_, Consumer::workspace);
    ops::mse_backward(pred, mb.targets_f32, mc, dpred);
  } else {
    HR_ARG_CHECK(mb.targets.defined(), "mlp classification batch needs int32 targets");
    ops::CrossEntropyConfig ce;
    ce.reduction = ops::LossReduction::sum_div_count;
    ce.count = count;
    ce.loss_scale = loss.loss_scale;
    ce.host_targets = mb.host_targets();
    Tensor no_losses;
    value = ops::cross_entropy_forward(pred, mb.targets, ce, no_losses);
    if (!backward) return value;
    if (opt.on_forward_end) opt.on_forward_end();
    dpred = Tensor::empty(dev, pred.shape(), dtype_, Consumer::workspace);
    ops::cross_entropy_backward(pred, mb.targets, ce, dpred);
  }
  pred = Tensor();
  Tensor dxL = Tensor::empty(dev, xL.shape(), dtype_, Consumer::workspace);
  ops::linear_backward(xL, P(w_[last]).compute, dpred, dxL, P(w_[last]).grad, P(b_[last]).grad);
  dpred = xL = Tensor();
  stack.backward(dxL, false);
  stack.add_forward_counts_to(opt.segment_forward_counts);
  return value;
}

std::vector<int64_t> MlpModel::param_blocks() const {
  // Block l is layer l's linear map, its norm and its adapters; the last layer is
  // the head, outside the blocks.
  std::vector<int64_t> out(params_.size(), -1);
  auto mark = [&](int index, int64_t block) {
    if (index >= 0) out[static_cast<size_t>(index)] = block;
  };
  for (int64_t l = 0; l < num_blocks(); ++l) {
    const size_t i = static_cast<size_t>(l);
    mark(w_[i], l);
    mark(b_[i], l);
    mark(gamma_[i], l);
    mark(beta_[i], l);
    if (i < la_.size()) mark(la_[i], l);
    if (i < lb_.size()) mark(lb_[i], l);
  }
  return out;
}

LossValue MlpModel::forward_backward(const Batch& mb, const LossSpec& loss, PassOptions& opt) {
  return run(mb, loss, opt, true);
}

LossValue MlpModel::forward_loss(const Batch& mb, const LossSpec& loss, PassOptions& opt) {
  return run(mb, loss, opt, false);
}

}  // namespace hr
