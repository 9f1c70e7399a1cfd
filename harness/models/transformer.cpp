// The controlled transformer's forward and backward passes (see transformer.hpp).
// Tensors a block keeps for its backward pass are Consumer::activations when the
// block keeps state and workspace otherwise; gradients of activations are
// workspace. Each temporary is released as soon as it has been used, so the
// tracker's peaks are what this model needs, not what it happened to leave alive.
#include "harness/models/transformer.hpp"

#include <cmath>

#include "harness/check.hpp"
#include "kernels/attention/attention.hpp"
#include "kernels/crossentropy/crossentropy.hpp"
#include "kernels/dropout/dropout.hpp"
#include "kernels/elementwise/elementwise.hpp"
#include "kernels/embedding/embedding.hpp"
#include "kernels/gelu/gelu.hpp"
#include "kernels/layernorm/layernorm.hpp"
#include "kernels/matmul/matmul.hpp"

namespace hr {

struct TransformerModel::State final : BlockState {
  Tensor x;                  // block input [N, C]
  Tensor ln1, mean1, rstd1;  // LN1 out [N, C], fp32 [N] x 2
  Tensor q, k, v, att;       // [B, H, T, D]
  ops::AttentionSaved saved; // probabilities or log-sum-exp
  Tensor x1;                 // after the attention residual [N, C]
  Tensor ln2, mean2, rstd2;
  Tensor fc, act;            // [N, r C] before and after GELU
  DropoutDraw drop_probs, drop_attn, drop_mlp;  // replay the three sites' masks
};

TransformerModel::TransformerModel(Device& dev, const TransformerConfig& cfg, ParamStorage storage, uint64_t seed,
                                   int64_t lora_rank, float lora_alpha)
    : Model(ParamSet(dev, storage, seed)), cfg_(cfg), dtype_(storage.compute), lora_rank_(lora_rank) {
  HR_ARG_CHECK(lora_rank >= 0, "adapters.rank: {} < 0", lora_rank);
  if (lora_rank > 0) lora_scale_ = lora_alpha / static_cast<float>(lora_rank);
  params_.set_add_frozen(lora_rank > 0);
  const int64_t C = cfg.d_model, R = cfg.mlp_ratio * cfg.d_model;
  const float std = 0.02f;
  const float proj_std = std / std::sqrt(2.f * static_cast<float>(cfg.layers));
  auto idx = [&](Param&) { return static_cast<int>(params_.size() - 1); };
  wte_ = idx(params_.add_normal("wte", {cfg.vocab, C}, std));
  wpe_ = idx(params_.add_normal("wpe", {cfg.max_positions, C}, std));
  for (int64_t l = 0; l < cfg.layers; ++l) {
    const std::string h = fmt::format("h.{}.", l);
    BlockParams b{};
    b.ln1_w = idx(params_.add_const(h + "ln1.weight", {C}, 1.f));
    b.ln1_b = idx(params_.add_const(h + "ln1.bias", {C}, 0.f));
    b.q_w = idx(params_.add_normal(h + "attn.q.weight", {C, C}, std));
    b.q_b = idx(params_.add_const(h + "attn.q.bias", {C}, 0.f));
    b.k_w = idx(params_.add_normal(h + "attn.k.weight", {C, C}, std));
    b.k_b = idx(params_.add_const(h + "attn.k.bias", {C}, 0.f));
    b.v_w = idx(params_.add_normal(h + "attn.v.weight", {C, C}, std));
    b.v_b = idx(params_.add_const(h + "attn.v.bias", {C}, 0.f));
    b.o_w = idx(params_.add_normal(h + "attn.proj.weight", {C, C}, proj_std));
    b.o_b = idx(params_.add_const(h + "attn.proj.bias", {C}, 0.f));
    b.ln2_w = idx(params_.add_const(h + "ln2.weight", {C}, 1.f));
    b.ln2_b = idx(params_.add_const(h + "ln2.bias", {C}, 0.f));
    b.fc_w = idx(params_.add_normal(h + "mlp.fc.weight", {R, C}, std));
    b.fc_b = idx(params_.add_const(h + "mlp.fc.bias", {R}, 0.f));
    b.proj_w = idx(params_.add_normal(h + "mlp.proj.weight", {C, R}, proj_std));
    b.proj_b = idx(params_.add_const(h + "mlp.proj.bias", {C}, 0.f));
    blocks_.push_back(b);
  }
  lnf_w_ = idx(params_.add_const("ln_f.weight", {C}, 1.f));
  lnf_b_ = idx(params_.add_const("ln_f.bias", {C}, 0.f));
  head_w_ = idx(params_.add_normal("lm_head.weight", {cfg.vocab, C}, std));
  params_.set_add_frozen(false);
  if (lora_rank > 0) {
    const float bound = 1.f / std::sqrt(static_cast<float>(C));
    for (int64_t l = 0; l < cfg.layers; ++l) {
      const std::string h = fmt::format("h.{}.attn.", l);
      BlockParams& b = blocks_[static_cast<size_t>(l)];
      b.q_la = idx(params_.add_uniform(h + "q.lora_A", {lora_rank, C}, bound));
      b.q_lb = idx(params_.add_lora_b(h + "q.lora_B", {C, lora_rank}));
      b.v_la = idx(params_.add_uniform(h + "v.lora_A", {lora_rank, C}, bound));
      b.v_lb = idx(params_.add_lora_b(h + "v.lora_B", {C, lora_rank}));
    }
  }
}

void TransformerModel::lora_forward(int a, int b, const Tensor& x, Tensor& lin) {
  Device& dev = x.device();
  const int64_t N = x.dim(0);
  Tensor u = Tensor::empty(dev, {N, lora_rank_}, dtype_, Consumer::workspace);
  ops::linear_forward(x, P(a).compute, Tensor(), u);
  ops::scale(u, lora_scale_, u);
  Tensor d = Tensor::empty(dev, lin.shape(), dtype_, Consumer::workspace);
  ops::linear_forward(u, P(b).compute, Tensor(), d);
  u = Tensor();
  ops::add(lin, d, lin);
}

void TransformerModel::lora_backward(int a, int b, const Tensor& x, const Tensor& dlin, Tensor& dx) {
  Device& dev = x.device();
  const int64_t N = x.dim(0);
  Tensor no_bias;
  Tensor u = Tensor::empty(dev, {N, lora_rank_}, dtype_, Consumer::workspace);  // recomputed, not kept
  ops::linear_forward(x, P(a).compute, Tensor(), u);
  ops::scale(u, lora_scale_, u);
  Tensor du = Tensor::empty(dev, {N, lora_rank_}, dtype_, Consumer::workspace);
  ops::linear_backward(u, P(b).compute, dlin, du, P(b).grad, no_bias);  // dB += dlin^T (s u)
  u = Tensor();
  ops::scale(du, lora_scale_, du);
  // dA += (s dlin B)^T x; dx += s dlin B A
  ops::linear_backward(x, P(a).compute, du, dx, P(a).grad, no_bias, ops::DxWrite::accumulate);
}

void TransformerModel::layernorm_backward_params(const Tensor& dy, const Tensor& x, int w, int b, const Tensor& mean,
                                                 const Tensor& rstd, Tensor& dx) {
  if (P(w).grad.defined()) {
    ops::layernorm_backward(dy, x, P(w).compute, mean, rstd, dx, P(w).grad, P(b).grad);
    return;
  }
  const int64_t C = x.dim(-1);
  Tensor dg = Tensor::zeros(x.device(), {C}, DType::f32, Consumer::workspace);
  Tensor db = Tensor::zeros(x.device(), {C}, DType::f32, Consumer::workspace);
  ops::layernorm_backward(dy, x, P(w).compute, mean, rstd, dx, dg, db);
}

int64_t TransformerModel::loss_items(const Batch& mb) const {
  return ops::count_real_tokens(mb.targets, cfg_.ignore_index, mb.host_targets());
}

Tensor TransformerModel::block_forward(int64_t i, const Tensor& x, bool keep, bool recompute, Consumer out_consumer,
                                       DropoutStream& rng, std::unique_ptr<BlockState>* state) {
  const BlockParams& bp = blocks_[static_cast<size_t>(i)];
  Device& dev = x.device();
  const int64_t C = cfg_.d_model, H = cfg_.heads, D = cfg_.head_dim(), N = B_ * T_, R = cfg_.mlp_ratio * C;
  const Consumer a = keep ? Consumer::activations : Consumer::workspace;
  const Consumer ws = Consumer::workspace;
  // MEM-1's negative controls charge kept tensors to workspace (StepConfig::kept_label_fault).
  const Consumer stats_c = label_fault_ == KeptLabelFault::norm_stats ? ws : a;
  const Consumer fc_c = label_fault_ == KeptLabelFault::block_hidden ? ws : a;
  count_block_forward(i);
  auto st = std::make_unique<State>();
  st->x = x;

  // ---- attention branch ----
  st->ln1 = Tensor::empty(dev, {N, C}, dtype_, a);
  st->mean1 = Tensor::empty(dev, {N}, DType::f32, stats_c);
  st->rstd1 = Tensor::empty(dev, {N}, DType::f32, stats_c);
  ops::layernorm_forward(x, P(bp.ln1_w).compute, P(bp.ln1_b).compute, cfg_.ln_eps, st->ln1, st->mean1, st->rstd1);
  auto project_heads = [&](int w, int b, int la = -1, int lb = -1) {
    Tensor lin = Tensor::empty(dev, {N, C}, dtype_, ws);
    ops::linear_forward(st->ln1, P(w).compute, P(b).compute, lin);
    if (la >= 0) lora_forward(la, lb, st->ln1, lin);
    Tensor heads = Tensor::empty(dev, {B_, H, T_, D}, dtype_, a);
    ops::split_heads(lin.reshape({B_, T_, C}), H, heads);
    return heads;
  };
  st->q = project_heads(bp.q_w, bp.q_b, bp.q_la, bp.q_lb);
  st->k = project_heads(bp.k_w, bp.k_b);
  st->v = project_heads(bp.v_w, bp.v_b, bp.v_la, bp.v_lb);
  st->att = Tensor::empty(dev, {B_, H, T_, D}, dtype_, a);
  const ops::AttentionImpl impl =
      cfg_.memory_efficient_attention ? ops::AttentionImpl::memory_efficient : ops::AttentionImpl::naive;
  const float scale = 1.f / std::sqrt(static_cast<float>(D));
  const float pp = cfg_.attn_probs_p();
  ops::AttnProbDropout probs_drop;
  if (pp > 0.f) {  // [B, H, T, T]: one sample per batch row
    st->drop_probs = rng.take(i, DropoutSite::attn_probs, {B_, H, T_, T_}, B_);
    const DropoutDraw draw = st->drop_probs;
    probs_drop.forward = [draw, pp](const Tensor& x, Tensor& y) { dropout_apply_forward(draw, pp, x, y); };
  }
  ops::attention_forward(impl, st->q, st->k, st->v, mask_, scale, st->att, st->saved, a, probs_drop);
  st->x1 = Tensor::empty(dev, {N, C}, dtype_, a);
  {
    Tensor merged = Tensor::empty(dev, {B_, T_, C}, dtype_, ws);
    ops::merge_heads(st->att, merged);
    Tensor proj = Tensor::empty(dev, {N, C}, dtype_, ws);
    ops::linear_forward(merged.reshape({N, C}), P(bp.o_w).compute, P(bp.o_b).compute, proj);
    const float pa = cfg_.attn_out_p();
    if (pa > 0.f) {  // T rows per sample
      st->drop_attn = rng.take(i, DropoutSite::attn_out, {N, C}, B_);
      Tensor dropped = Tensor::empty(dev, {N, C}, dtype_, ws);
      dropout_apply_forward(st->drop_attn, pa, proj, dropped);
      proj = dropped;
    }
    ops::add(x, proj, st->x1);
  }

  // ---- MLP branch ----
  st->ln2 = Tensor::empty(dev, {N, C}, dtype_, a);
  st->mean2 = Tensor::empty(dev, {N}, DType::f32, stats_c);
  st->rstd2 = Tensor::empty(dev, {N}, DType::f32, stats_c);
  ops::layernorm_forward(st->x1, P(bp.ln2_w).compute, P(bp.ln2_b).compute, cfg_.ln_eps, st->ln2, st->mean2,
                         st->rstd2);
  st->fc = Tensor::empty(dev, {N, R}, dtype_, fc_c);
  ops::linear_forward(st->ln2, P(bp.fc_w).compute, P(bp.fc_b).compute, st->fc);
  st->act = Tensor::empty(dev, {N, R}, dtype_, a);
  ops::gelu_forward(st->fc, st->act);
  Tensor out = Tensor::empty(dev, {N, C}, dtype_, out_consumer);
  {
    Tensor m = Tensor::empty(dev, {N, C}, dtype_, ws);
    ops::linear_forward(st->act, P(bp.proj_w).compute, P(bp.proj_b).compute, m);
    if (cfg_.dropout > 0.f) {  // a site with p = 0 draws nothing (as the other two)
      st->drop_mlp = rng.take(i, DropoutSite::mlp_out, {N, C}, B_);
      Tensor dropped = Tensor::empty(dev, {N, C}, dtype_, ws);
      dropout_apply_forward(st->drop_mlp, cfg_.dropout, m, dropped);
      m = dropped;
    }
    ops::add(st->x1, m, out);
  }
  (void)recompute;  // no state besides the parameters: nothing to guard on recompute
  if (keep) *state = std::move(st);
  return out;
}

Tensor TransformerModel::block_backward(int64_t i, BlockState& state, const Tensor& dy, bool need_dx) {
  const BlockParams& bp = blocks_[static_cast<size_t>(i)];
  auto& st = static_cast<State&>(state);
  Device& dev = dy.device();
  const int64_t C = cfg_.d_model, H = cfg_.heads, D = cfg_.head_dim(), N = B_ * T_, R = cfg_.mlp_ratio * C;
  const Consumer ws = Consumer::workspace;

  // ---- MLP branch: x2 = x1 + dropout(proj(gelu(fc(ln2(x1))))) ----
  Tensor dx1 = Tensor::empty(dev, {N, C}, dtype_, ws);
  {
    Tensor dm = dy;
    if (cfg_.dropout > 0.f) {
      dm = Tensor::empty(dev, {N, C}, dtype_, ws);
      dropout_apply_backward(st.drop_mlp, cfg_.dropout, dy, dm);
    }
    Tensor dact = Tensor::empty(dev, {N, R}, dtype_, ws);
    ops::linear_backward(st.act, P(bp.proj_w).compute, dm, dact, P(bp.proj_w).grad, P(bp.proj_b).grad);
    dm = Tensor();
    st.act = Tensor();
    Tensor dfc = Tensor::empty(dev, {N, R}, dtype_, ws);
    ops::gelu_backward(st.fc, dact, dfc);
    dact = Tensor();
    st.fc = Tensor();
    Tensor dln2 = Tensor::empty(dev, {N, C}, dtype_, ws);
    ops::linear_backward(st.ln2, P(bp.fc_w).compute, dfc, dln2, P(bp.fc_w).grad, P(bp.fc_b).grad);
    dfc = Tensor();
    st.ln2 = Tensor();
    layernorm_backward_params(dln2, st.x1, bp.ln2_w, bp.ln2_b, st.mean2, st.rstd2, dx1);
    ops::add(dx1, dy, dx1);  // the residual path
    st.x1 = st.mean2 = st.rstd2 = Tensor();
  }

  // ---- attention branch: x1 = x + proj(merge(attn(q, k, v))) ----
  Tensor dq = Tensor::empty(dev, {B_, H, T_, D}, dtype_, ws);
  Tensor dk = Tensor::empty(dev, {B_, H, T_, D}, dtype_, ws);
  Tensor dv = Tensor::empty(dev, {B_, H, T_, D}, dtype_, ws);
  {
    const float pa = cfg_.attn_out_p();
    Tensor dproj = dx1;
    if (pa > 0.f) {
      dproj = Tensor::empty(dev, {N, C}, dtype_, ws);
      dropout_apply_backward(st.drop_attn, pa, dx1, dproj);
    }
    Tensor merged = Tensor::empty(dev, {B_, T_, C}, dtype_, ws);
    ops::merge_heads(st.att, merged);
    Tensor dmerged = Tensor::empty(dev, {N, C}, dtype_, ws);
    ops::linear_backward(merged.reshape({N, C}), P(bp.o_w).compute, dproj, dmerged, P(bp.o_w).grad, P(bp.o_b).grad);
    merged = Tensor();
    dproj = Tensor();
    Tensor datt = Tensor::empty(dev, {B_, H, T_, D}, dtype_, ws);
    ops::split_heads(dmerged.reshape({B_, T_, C}), H, datt);
    dmerged = Tensor();
    const ops::AttentionImpl impl =
        cfg_.memory_efficient_attention ? ops::AttentionImpl::memory_efficient : ops::AttentionImpl::naive;
    const float scale = 1.f / std::sqrt(static_cast<float>(D));
    const float pp = cfg_.attn_probs_p();
    ops::AttnProbDropout probs_drop;
    if (pp > 0.f) {
      const DropoutDraw draw = st.drop_probs;
      probs_drop.forward = [draw, pp](const Tensor& x, Tensor& y) { dropout_apply_forward(draw, pp, x, y); };
      probs_drop.backward = [draw, pp](const Tensor& dy, Tensor& dx) { dropout_apply_backward(draw, pp, dy, dx); };
    }
    ops::attention_backward(impl, st.q, st.k, st.v, st.att, datt, mask_, scale, st.saved, dq, dk, dv, probs_drop);
    st.q = st.k = st.v = st.att = Tensor();
    st.saved = ops::AttentionSaved{};
  }
  Tensor dln1 = Tensor::empty(dev, {N, C}, dtype_, ws);
  {
    // q, k and v all read ln1: their input gradients add up in dln1, each product
    // added into it (beta = 1) after the first.
    Tensor lin = Tensor::empty(dev, {B_, T_, C}, dtype_, ws);
    auto back = [&](Tensor& dh, int w, int b, ops::DxWrite write, int la = -1, int lb = -1) {
      ops::merge_heads(dh, lin);
      dh = Tensor();
      ops::linear_backward(st.ln1, P(w).compute, lin.reshape({N, C}), dln1, P(w).grad, P(b).grad, write);
      if (la >= 0) lora_backward(la, lb, st.ln1, lin.reshape({N, C}), dln1);
    };
    back(dq, bp.q_w, bp.q_b, ops::DxWrite::overwrite, bp.q_la, bp.q_lb);
    back(dk, bp.k_w, bp.k_b, ops::DxWrite::accumulate);
    back(dv, bp.v_w, bp.v_b, ops::DxWrite::accumulate, bp.v_la, bp.v_lb);
    st.ln1 = Tensor();
  }
  Tensor dx = Tensor::empty(dev, {N, C}, dtype_, ws);
  layernorm_backward_params(dln1, st.x, bp.ln1_w, bp.ln1_b, st.mean1, st.rstd1, dx);
  ops::add(dx, dx1, dx);
  st.x = st.mean1 = st.rstd1 = Tensor();
  (void)need_dx;  // block 0's dx feeds the embedding gradient: always needed
  return dx;
}

LossValue TransformerModel::run(const Batch& mb, const LossSpec& loss, PassOptions& opt, bool backward) {
  HR_CHECK(opt.rng != nullptr, "transformer: PassOptions.rng is required");
  HR_ARG_CHECK(mb.ids.defined() && mb.pos.defined() && mb.targets.defined(),
               "transformer batch needs ids, pos and targets");
  Device& dev = params_.device();
  B_ = mb.ids.dim(0);
  T_ = mb.ids.dim(1);
  HR_ARG_CHECK(T_ <= cfg_.max_positions, "seq_len: {} exceeds max_positions {}", T_, cfg_.max_positions);
  const int64_t C = cfg_.d_model, N = B_ * T_, V = cfg_.vocab;
  mask_ = ops::AttnMask{};
  mask_.causal = true;
  mask_.key_valid_len = mb.key_valid_len;
  mask_.segment_ids = mb.segment_ids;
  label_fault_ = backward ? opt.kept_label_fault : KeptLabelFault::none;

  Tensor x0 = Tensor::empty(dev, {B_, T_, C}, dtype_, backward ? Consumer::activations : Consumer::workspace);
  const ops::EmbeddingHostIds host_ids{mb.host_ids(), mb.host_pos()};
  ops::embedding_forward(mb.ids, mb.pos, P(wte_).compute, P(wpe_).compute, x0, host_ids);

  CheckpointPolicy policy = opt.checkpoint;
  if (!backward) policy.every_k_blocks = 0;
  // Forward only: a stack that keeps nothing. Implemented by a checkpointed run
  // (every block is then a temporary) that is never run backward.
  CheckpointedStack stack(*this, backward ? policy : CheckpointPolicy{int64_t{1} << 40}, opt.hooks);
  Tensor xL = stack.forward(x0.reshape({N, C}), *opt.rng);

  const Consumer a = backward ? Consumer::activations : Consumer::workspace;
  Tensor lnf = Tensor::empty(dev, {N, C}, dtype_, a);
  const Consumer stats_f = label_fault_ == KeptLabelFault::norm_stats ? Consumer::workspace : a;
  Tensor meanf = Tensor::empty(dev, {N}, DType::f32, stats_f);
  Tensor rstdf = Tensor::empty(dev, {N}, DType::f32, stats_f);
  ops::layernorm_forward(xL, P(lnf_w_).compute, P(lnf_b_).compute, cfg_.ln_eps, lnf, meanf, rstdf);
  Tensor logits = Tensor::empty(dev, {N, V}, dtype_, a);
  ops::linear_forward(lnf, P(head_w_).compute, Tensor(), logits);
  if (opt.on_logits) opt.on_logits(logits);

  ops::CrossEntropyConfig ce;
  ce.ignore_index = cfg_.ignore_index;
  ce.reduction = ops::LossReduction::sum_div_count;
  ce.count = loss.count / loss.multiplier;
  ce.loss_scale = loss.loss_scale;
  ce.host_targets = mb.host_targets();  // row-major [B, T]: the order of the reshaped targets
  const Tensor targets = mb.targets.reshape({N});
  Tensor no_losses;
  const LossValue value = ops::cross_entropy_forward(logits, targets, ce, no_losses);
  if (!backward) return value;
  if (opt.on_forward_end) opt.on_forward_end();

  Tensor dlnf = Tensor::empty(dev, {N, C}, dtype_, Consumer::workspace);
  {
    Tensor dlogits = Tensor::empty(dev, {N, V}, dtype_, Consumer::workspace);
    ops::cross_entropy_backward(logits, targets, ce, dlogits);
    logits = Tensor();
    Tensor no_bias_grad;
    ops::linear_backward(lnf, P(head_w_).compute, dlogits, dlnf, P(head_w_).grad, no_bias_grad);
  }
  lnf = Tensor();
  Tensor dxL = Tensor::empty(dev, {N, C}, dtype_, Consumer::workspace);
  layernorm_backward_params(dlnf, xL, lnf_w_, lnf_b_, meanf, rstdf, dxL);
  dlnf = meanf = rstdf = xL = Tensor();

  Tensor dx0 = stack.backward(dxL, true);
  dxL = Tensor();
  x0 = Tensor();
  if (P(wte_).grad.defined())  // frozen embeddings (LoRA): no gradient to scatter
    ops::embedding_backward(mb.ids, mb.pos, dx0.reshape({B_, T_, C}), P(wte_).grad, P(wpe_).grad, host_ids);
  stack.add_forward_counts_to(opt.segment_forward_counts);
  return value;
}

std::vector<int64_t> TransformerModel::param_blocks() const {
  std::vector<int64_t> out(params_.size(), -1);
  for (size_t l = 0; l < blocks_.size(); ++l) {
    const BlockParams& b = blocks_[l];
    for (int i : {b.ln1_w, b.ln1_b, b.q_w, b.q_b, b.k_w, b.k_b, b.v_w, b.v_b, b.o_w, b.o_b, b.ln2_w, b.ln2_b, b.fc_w,
                  b.fc_b, b.proj_w, b.proj_b, b.q_la, b.q_lb, b.v_la, b.v_lb})
      if (i >= 0) out[static_cast<size_t>(i)] = static_cast<int64_t>(l);
  }
  return out;
}

LossValue TransformerModel::forward_backward(const Batch& mb, const LossSpec& loss, PassOptions& opt) {
  return run(mb, loss, opt, true);
}

LossValue TransformerModel::forward_loss(const Batch& mb, const LossSpec& loss, PassOptions& opt) {
  return run(mb, loss, opt, false);
}

}  // namespace hr
