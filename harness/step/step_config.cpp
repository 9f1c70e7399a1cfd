// Step configuration: validation naming the field, presets, JSON round trip.
#include "harness/step/step_config.hpp"

#include <nlohmann/json.hpp>

#include <cmath>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <type_traits>

#include "harness/check.hpp"

namespace hr {

const char* model_kind_name(ModelKind k) { return k == ModelKind::mlp ? "mlp" : "transformer"; }

ModelKind parse_model_kind(const std::string& s) {
  if (s == "mlp") return ModelKind::mlp;
  if (s == "transformer") return ModelKind::transformer;
  throw InvalidArgument(fmt::format("model: unknown model '{}' (expected mlp or transformer)", s));
}

const char* loss_normalization_name(LossNormalization n) {
  switch (n) {
    case LossNormalization::mean_div_k: return "mean_div_k";
    case LossNormalization::sum_div_window_items: return "sum_div_window_items";
    case LossNormalization::no_division: return "no_division";
    case LossNormalization::mean_div_k_plus_one: return "mean_div_k_plus_one";
    case LossNormalization::sum_div_window_items_plus_one: return "sum_div_window_items_plus_one";
  }
  return "?";
}

LossNormalization parse_loss_normalization(const std::string& s) {
  if (s == "mean_div_k") return LossNormalization::mean_div_k;
  if (s == "sum_div_window_items") return LossNormalization::sum_div_window_items;
  if (s == "no_division") return LossNormalization::no_division;
  if (s == "mean_div_k_plus_one") return LossNormalization::mean_div_k_plus_one;
  if (s == "sum_div_window_items_plus_one") return LossNormalization::sum_div_window_items_plus_one;
  throw InvalidArgument(fmt::format(
      "loss_norm: unknown loss normalisation '{}' (expected mean_div_k, sum_div_window_items, no_division, "
      "mean_div_k_plus_one or sum_div_window_items_plus_one)", s));
}

const char* sharding_name(Sharding s) {
  switch (s) {
    case Sharding::none: return "none";
    case Sharding::zero1: return "zero1";
    case Sharding::zero2: return "zero2";
    case Sharding::zero3: return "zero3";
  }
  return "?";
}

Sharding parse_sharding(const std::string& s) {
  if (s == "none") return Sharding::none;
  if (s == "zero1") return Sharding::zero1;
  if (s == "zero2") return Sharding::zero2;
  if (s == "zero3") return Sharding::zero3;
  throw InvalidArgument(fmt::format("sharding: unknown sharding '{}' (expected none, zero1, zero2 or zero3)", s));
}

namespace {

// Every size has a range: past it a step is not a model headroom can run (a loop
// of billions of micro-batches, byte counts past 2^64), refused before anything
// is computed from it.
void check_size(int64_t v, const char* field, int64_t max) {
  HR_ARG_CHECK(v > 0, "{}: must be positive, got {}", field, v);
  HR_ARG_CHECK(v <= max, "{}: must be in [1, {}], got {}", field, max, v);
}

// A real number in [lo, hi] (and finite): what a learning rate, an epsilon or a
// scale can be; past it the value is a typo, not a configuration.
void check_range(double v, const char* field, double lo, double hi) {
  HR_ARG_CHECK(std::isfinite(v) && v >= lo && v <= hi, "{}: must be in [{:g}, {:g}], got {}", field, lo, hi, v);
}

void check_prob(float p, const char* field) {
  HR_ARG_CHECK(p >= 0.f && p < 1.f, "{}: dropout probability must be in [0, 1), got {}", field, p);
}

}  // namespace

void validate(const StepConfig& c) {
  check_size(c.batch, "batch", kMaxBatchRows);
  check_size(c.micro_batch, "micro_batch", kMaxBatchRows);
  HR_ARG_CHECK(c.batch % c.micro_batch == 0, "micro_batch: {} does not divide batch {}", c.micro_batch, c.batch);
  HR_ARG_CHECK(c.accum_steps() <= kMaxAccumSteps,
               "micro_batch: {} rows make {} micro-batches of batch {}; at most {} per step", c.micro_batch,
               c.accum_steps(), c.batch, kMaxAccumSteps);
  HR_ARG_CHECK(is_float(c.precision.compute), "precision.compute: unknown compute dtype '{}' (expected fp32, fp16 or bf16)",
               dtype_name(c.precision.compute));
  HR_ARG_CHECK(is_float(c.precision.grad_accum),
               "precision.grad_accum: unknown gradient buffer dtype '{}' (expected fp32, fp16 or bf16)",
               dtype_name(c.precision.grad_accum));
  HR_ARG_CHECK(c.loss_multiplier > 0 && std::isfinite(c.loss_multiplier),
               "loss_multiplier: must be positive and finite, got {}", c.loss_multiplier);
  HR_ARG_CHECK(c.checkpoint.every_k_blocks >= 0 && c.checkpoint.every_k_blocks <= kMaxLayers,
               "checkpoint.every_k_blocks: must be >= 0 (0 = off) and at most {}, got {}", kMaxLayers,
               c.checkpoint.every_k_blocks);
  HR_ARG_CHECK(c.checkpoint.fault_flip_mask_elements >= 0 && c.checkpoint.fault_extra_block_forwards >= 0 &&
                   c.checkpoint.fault_grad_ulp_elements >= 0,
               "checkpoint.fault_*: counts must be >= 0, got {}, {} and {}", c.checkpoint.fault_flip_mask_elements,
               c.checkpoint.fault_extra_block_forwards, c.checkpoint.fault_grad_ulp_elements);
  for (const int64_t n : {c.checkpoint.fault_flip_mask_elements, c.checkpoint.fault_extra_block_forwards,
                          c.checkpoint.fault_grad_ulp_elements})
    HR_ARG_CHECK(n <= kMaxBatchRows, "checkpoint.fault_*: counts must be at most {}, got {}", kMaxBatchRows, n);
  const LossScalerConfig& s = c.precision.scaler;
  if (c.loss_scaling()) {
    check_range(s.init_scale, "precision.scaler.init_scale", 0x1p-64, 0x1p64);
    check_range(s.growth, "precision.scaler.growth", 1.0, 1024.0);
    HR_ARG_CHECK(s.growth_interval <= (int64_t{1} << 31), "precision.scaler.growth_interval: must be at most 2^31, got {}",
                 s.growth_interval);
    HR_ARG_CHECK(s.init_scale > 0 && std::isfinite(s.init_scale), "precision.scaler.init_scale: must be positive, got {}",
                 s.init_scale);
    HR_ARG_CHECK(s.growth >= 1.0, "precision.scaler.growth: must be >= 1, got {}", s.growth);
    HR_ARG_CHECK(s.backoff > 0 && s.backoff < 1.0, "precision.scaler.backoff: must be in (0, 1), got {}", s.backoff);
    HR_ARG_CHECK(s.growth_interval > 0, "precision.scaler.growth_interval: must be positive, got {}",
                 s.growth_interval);
  }
  switch (c.optimizer.kind) {
    case OptimizerKind::sgd:
      HR_ARG_CHECK(c.optimizer.sgd.lr >= 0.f, "optimizer.sgd.lr: must be >= 0, got {}", c.optimizer.sgd.lr);
      check_range(c.optimizer.sgd.lr, "optimizer.sgd.lr", 0, 1e6);
      check_range(c.optimizer.sgd.momentum, "optimizer.sgd.momentum", 0, 0.999999);
      check_range(c.optimizer.sgd.weight_decay, "optimizer.sgd.weight_decay", 0, 1e3);
      break;
    case OptimizerKind::adamw8bit:
      HR_ARG_CHECK(c.optimizer.adamw8bit.block_size > 0, "optimizer.adamw8bit.block_size: must be positive, got {}",
                   c.optimizer.adamw8bit.block_size);
      check_size(c.optimizer.adamw8bit.block_size, "optimizer.adamw8bit.block_size", kMaxBatchRows);
      [[fallthrough]];
    case OptimizerKind::adamw:
      HR_ARG_CHECK(c.optimizer.adamw.lr >= 0.f, "optimizer.adamw.lr: must be >= 0, got {}", c.optimizer.adamw.lr);
      check_range(c.optimizer.adamw.lr, "optimizer.adamw.lr", 0, 1e6);
      check_range(c.optimizer.adamw.eps, "optimizer.adamw.eps", 1e-30, 1);
      check_range(c.optimizer.adamw.weight_decay, "optimizer.adamw.weight_decay", 0, 1e3);
      HR_ARG_CHECK(c.optimizer.adamw.beta1 >= 0.f && c.optimizer.adamw.beta1 < 1.f &&
                       c.optimizer.adamw.beta2 >= 0.f && c.optimizer.adamw.beta2 < 1.f,
                   "optimizer.adamw.beta1/beta2: must be in [0, 1), got {} / {}", c.optimizer.adamw.beta1,
                   c.optimizer.adamw.beta2);
      break;
    case OptimizerKind::custom:
      HR_ARG_CHECK(static_cast<bool>(c.optimizer.factory), "optimizer.factory: kind 'custom' needs a factory");
      break;
  }
  if (c.adapters.kind == AdapterKind::lora) {
    HR_ARG_CHECK(c.model == ModelKind::transformer || c.mlp.norm != NormKind::batchnorm,
                 "adapters.kind: lora on the mlp needs norm none or layernorm (batchnorm given)");
    const int64_t width = c.model == ModelKind::transformer ? c.transformer.d_model : c.mlp.width;
    HR_ARG_CHECK(c.adapters.rank > 0 && c.adapters.rank <= width, "adapters.rank: {} must be in [1, {}]",
                 c.adapters.rank, width);
    HR_ARG_CHECK(std::isfinite(c.adapters.alpha) && c.adapters.alpha > 0.f, "adapters.alpha: {} must be > 0",
                 c.adapters.alpha);
    check_range(c.adapters.alpha, "adapters.alpha", 1e-6, 1e6);
  }
  HR_ARG_CHECK(std::isfinite(c.adapters.b_init_std) && c.adapters.b_init_std >= 0.f && c.adapters.b_init_std <= 1e3f,
               "adapters.b_init_std: {} must be in [0, 1000]", c.adapters.b_init_std);
  HR_ARG_CHECK(c.adapters.b_init_std == 0.f || c.adapters.kind == AdapterKind::lora,
               "adapters.b_init_std: {} needs adapters.kind lora", c.adapters.b_init_std);

  if (c.model == ModelKind::mlp) {
    const MlpConfig& m = c.mlp;
    check_size(m.in_dim, "mlp.in_dim", kMaxWidth);
    check_size(m.width, "mlp.width", kMaxWidth);
    check_size(m.out_dim, "mlp.out_dim", kMaxWidth);
    HR_ARG_CHECK(m.layers >= 2, "mlp.layers: at least 2 linear layers are needed, got {}", m.layers);
    check_size(m.layers, "mlp.layers", kMaxLayers);
    check_prob(m.dropout, "mlp.dropout");
    HR_ARG_CHECK(m.norm_eps > 0.f, "mlp.norm_eps: must be positive, got {}", m.norm_eps);
    check_range(m.norm_eps, "mlp.norm_eps", 1e-30, 1);
    check_range(m.bn_momentum, "mlp.bn_momentum", 0, 1);
    HR_ARG_CHECK(m.bn_virtual_batch >= 0, "mlp.bn_virtual_batch: must be >= 0 (0 = the micro-batch), got {}",
                 m.bn_virtual_batch);
    if (m.norm == NormKind::batchnorm) {
      const int64_t vb = m.bn_virtual_batch > 0 ? m.bn_virtual_batch : c.micro_batch;
      HR_ARG_CHECK(c.micro_batch % vb == 0, "mlp.bn_virtual_batch: {} does not divide micro_batch {}", vb,
                   c.micro_batch);
      HR_ARG_CHECK(vb >= 2, "mlp.bn_virtual_batch: BatchNorm needs at least 2 rows per (virtual) batch, got {}", vb);
    }
    HR_ARG_CHECK(m.fault_ln_batch_leak >= 0.f && m.fault_ln_batch_leak <= 1.f,
                 "mlp.fault_ln_batch_leak: a fraction in [0, 1], got {}", m.fault_ln_batch_leak);
    HR_ARG_CHECK(m.fault_ghost_bn_neighbour_leak >= 0.f && m.fault_ghost_bn_neighbour_leak <= 1.f,
                 "mlp.fault_ghost_bn_neighbour_leak: a fraction in [0, 1], got {}", m.fault_ghost_bn_neighbour_leak);
    HR_ARG_CHECK(m.fault_bn_recompute_channels >= 0, "mlp.fault_bn_recompute_channels: must be >= 0, got {}",
                 m.fault_bn_recompute_channels);
  } else {
    const TransformerConfig& t = c.transformer;
    check_size(t.vocab, "transformer.vocab", kMaxVocab);
    check_size(t.max_positions, "transformer.max_positions", kMaxSeqLen);
    check_size(t.d_model, "transformer.d_model", kMaxWidth);
    check_size(t.heads, "transformer.heads", t.d_model);
    check_size(t.layers, "transformer.layers", kMaxLayers);
    check_size(t.mlp_ratio, "transformer.mlp_ratio", kMaxMlpRatio);
    check_size(c.seq_len, "seq_len", kMaxSeqLen);
    HR_ARG_CHECK(t.d_model % t.heads == 0, "transformer.heads: {} does not divide d_model {}", t.heads, t.d_model);
    HR_ARG_CHECK(c.seq_len <= t.max_positions, "seq_len: {} is longer than transformer.max_positions {}",
                 c.seq_len, t.max_positions);
    check_prob(t.dropout, "transformer.dropout");
    if (t.attn_out_dropout >= 0.f) check_prob(t.attn_out_dropout, "transformer.attn_out_dropout");
    if (t.attn_probs_dropout >= 0.f) check_prob(t.attn_probs_dropout, "transformer.attn_probs_dropout");
    HR_ARG_CHECK(!(t.memory_efficient_attention && t.attn_probs_p() > 0.f),
                 "transformer.attn_probs_dropout: the memory-efficient attention has no dropout on its probabilities "
                 "(got {})", t.attn_probs_dropout);
    HR_ARG_CHECK(t.ln_eps > 0.f, "transformer.ln_eps: must be positive, got {}", t.ln_eps);
    check_range(t.ln_eps, "transformer.ln_eps", 1e-30, 1);
    HR_ARG_CHECK(t.ignore_index < 0 || t.ignore_index >= t.vocab,
                 "transformer.ignore_index: {} is a valid token id (vocab {})", t.ignore_index, t.vocab);
  }
}

StepConfig step_config_for(ModelKind model, Preset preset) {
  StepConfig c;
  c.model = model;
  if (model == ModelKind::mlp) {
    const MlpPreset p = mlp_preset(preset);
    c.mlp = p.model;
    c.batch = p.batch;
    c.micro_batch = p.micro_batch;
    c.seq_len = 0;
  } else {
    const TransformerPreset p = transformer_preset(preset);
    c.transformer = p.model;
    c.batch = p.batch;
    c.micro_batch = p.micro_batch;
    c.seq_len = p.seq_len;
  }
  if (preset == Preset::full) c.precision.compute = DType::bf16;
  return c;
}

void to_json(nlohmann::json& j, const StepConfig& c) {
  j = nlohmann::json::object();
  j["model"] = model_kind_name(c.model);
  if (c.model == ModelKind::mlp) {
    const MlpConfig& m = c.mlp;
    j["mlp"] = {{"in_dim", m.in_dim},       {"width", m.width},
                {"out_dim", m.out_dim},     {"layers", m.layers},
                {"norm", norm_kind_name(m.norm)}, {"task", mlp_task_name(m.task)},
                {"dropout", m.dropout},     {"norm_eps", m.norm_eps},
                {"bn_momentum", m.bn_momentum}, {"bn_virtual_batch", m.bn_virtual_batch}};
    // Injected faults (negative controls) only when set, so a correct configuration reads as before.
    if (m.fault_ln_batch_leak != 0.f) j["mlp"]["fault_ln_batch_leak"] = m.fault_ln_batch_leak;
    if (m.fault_ghost_bn_neighbour_leak != 0.f)
      j["mlp"]["fault_ghost_bn_neighbour_leak"] = m.fault_ghost_bn_neighbour_leak;
    if (m.fault_bn_recompute_channels != 0) j["mlp"]["fault_bn_recompute_channels"] = m.fault_bn_recompute_channels;
  } else {
    const TransformerConfig& t = c.transformer;
    j["transformer"] = {{"vocab", t.vocab},
                        {"max_positions", t.max_positions},
                        {"d_model", t.d_model},
                        {"heads", t.heads},
                        {"layers", t.layers},
                        {"mlp_ratio", t.mlp_ratio},
                        {"dropout", t.dropout},
                        {"attn_out_dropout", t.attn_out_dropout},
                        {"attn_probs_dropout", t.attn_probs_dropout},
                        {"ln_eps", t.ln_eps},
                        {"attention", t.memory_efficient_attention ? "memory_efficient" : "naive"},
                        {"ignore_index", t.ignore_index}};
    j["seq_len"] = c.seq_len;
  }
  j["batch"] = c.batch;
  j["micro_batch"] = c.micro_batch;
  j["accum_steps"] = c.accum_steps();
  j["precision"] = {{"compute", dtype_name(c.precision.compute)},
                    {"master_weights", c.precision.master_weights},
                    {"grad_accum", dtype_name(c.precision.grad_accum)},
                    {"scaler",
                     {{"enabled", c.precision.scaler.enabled},
                      {"dynamic", c.precision.scaler.dynamic},
                      {"init_scale", c.precision.scaler.init_scale},
                      {"growth", c.precision.scaler.growth},
                      {"backoff", c.precision.scaler.backoff},
                      {"growth_interval", c.precision.scaler.growth_interval}}}};
  j["loss_norm"] = loss_normalization_name(c.loss_norm);
  j["loss_multiplier"] = c.loss_multiplier;
  j["checkpoint"] = {{"every_k_blocks", c.checkpoint.every_k_blocks},
                     {"fresh_rng_on_recompute", c.checkpoint.fresh_rng_on_recompute},
                     {"update_bn_stats_on_recompute", c.checkpoint.update_bn_stats_on_recompute},
                     {"fault_flip_mask_elements", c.checkpoint.fault_flip_mask_elements},
                     {"fault_extra_block_forwards", c.checkpoint.fault_extra_block_forwards},
                     {"fault_never_recompute", c.checkpoint.fault_never_recompute},
                     {"fault_grad_ulp_elements", c.checkpoint.fault_grad_ulp_elements},
                     {"fault_keep_recomputed", c.checkpoint.fault_keep_recomputed},
                     {"fault_off_checkpoints_every_block", c.checkpoint.fault_off_checkpoints_every_block}};
  nlohmann::json o = {{"kind", optimizer_kind_name(c.optimizer.kind)}};
  if (c.optimizer.kind == OptimizerKind::sgd)
    o["sgd"] = {{"lr", c.optimizer.sgd.lr},
                {"momentum", c.optimizer.sgd.momentum},
                {"weight_decay", c.optimizer.sgd.weight_decay}};
  if (c.optimizer.kind == OptimizerKind::adamw8bit)
    o["adamw8bit"] = {{"block_size", c.optimizer.adamw8bit.block_size}};
  if (c.optimizer.kind == OptimizerKind::adamw || c.optimizer.kind == OptimizerKind::adamw8bit)
    o["adamw"] = {{"lr", c.optimizer.adamw.lr},     {"beta1", c.optimizer.adamw.beta1},
                  {"beta2", c.optimizer.adamw.beta2}, {"eps", c.optimizer.adamw.eps},
                  {"weight_decay", c.optimizer.adamw.weight_decay}};
  j["optimizer"] = o;
  j["adapters"] = {{"kind", c.adapters.kind == AdapterKind::none ? "none" : "lora"},
                   {"rank", c.adapters.rank},
                   {"alpha", c.adapters.alpha}};
  if (c.adapters.b_init_std != 0.f) j["adapters"]["b_init_std"] = c.adapters.b_init_std;
  j["init_seed"] = c.init_seed;
  j["dropout_seed"] = c.dropout_seed;
  j["dropout_keying"] = dropout_keying_name(c.dropout_keying);
  j["sharding"] = sharding_name(c.sharding);
}

namespace {

// Strict reading: every key of the file must be one the reader asks for, every
// value of the asked-for type and range, every section an object. get() and
// section() record what was asked for; check_no_unknown_keys() then names a
// key nobody asked for (a misspelling) with its JSON path and the keys known there.
struct Asked {
  std::map<const nlohmann::json*, std::set<std::string>> keys;  // object -> keys asked of it
};
thread_local Asked* g_asked = nullptr;

void mark_asked(const nlohmann::json& j, const char* key) {
  if (g_asked != nullptr) g_asked->keys[&j].insert(key);
}

}  // namespace

StepConfig without_faults(StepConfig c) {
  switch (c.loss_norm) {
    case LossNormalization::no_division:
    case LossNormalization::mean_div_k_plus_one: c.loss_norm = LossNormalization::mean_div_k; break;
    case LossNormalization::sum_div_window_items_plus_one: c.loss_norm = LossNormalization::sum_div_window_items; break;
    case LossNormalization::mean_div_k:
    case LossNormalization::sum_div_window_items: break;
  }
  c.precision.grad_accum = DType::f32;
  c.precision.master_weights = true;
  c.precision.fault_no_master.clear();
  c.precision.fault_fp32_activations = false;
  c.precision.fault_compute_fp16 = false;
  c.adapters.fault_not_frozen.clear();
  c.adapters.fault_b_init_std = 0.f;
  c.adapters.fault_merge_scale_alpha = false;
  c.adapters.fault_merge_scale_offset = 0;
  c.adapters.fault_grad_kept.clear();
  c.fault_extra_loss_items = 0;
  c.fault_dropout_key_per_run = false;
  c.fault_nondeterministic_ulp = false;
  c.fault_unscale_every_micro_batch = false;
  c.fault_unscale_into_fp16 = false;
  c.fault_step_count_frozen = false;
  c.precision.overflow_fault = OverflowFault::none;
  c.precision.scaler.fault_growth_off_by_one = false;
  c.precision.scaler.fault_no_backoff = false;
  c.precision.scaler.fault_tracker_kept = false;
  c.precision.scaler.fault_fixed_scale = 0;
  c.kept_label_fault = KeptLabelFault::none;
  c.dropout_keying = DropoutKeying::per_sample;
  c.checkpoint.fresh_rng_on_recompute = false;
  c.checkpoint.update_bn_stats_on_recompute = false;
  c.checkpoint.fault_flip_mask_elements = 0;
  c.checkpoint.fault_extra_block_forwards = 0;
  c.checkpoint.fault_never_recompute = false;
  c.checkpoint.fault_grad_ulp_elements = 0;
  c.checkpoint.fault_keep_recomputed = false;
  c.checkpoint.fault_off_checkpoints_every_block = false;
  c.mlp.fault_ln_batch_leak = 0.f;
  c.mlp.fault_ghost_bn_neighbour_leak = 0.f;
  c.mlp.fault_bn_recompute_channels = 0;
  return c;
}

std::string summary(const StepConfig& cfg) {
  std::string s;
  if (cfg.model == ModelKind::transformer) {
    const TransformerConfig& t = cfg.transformer;
    s = fmt::format("transformer d{} x{} layers, seq {}", t.d_model, t.layers, cfg.seq_len);
  } else {
    const MlpConfig& m = cfg.mlp;
    s = fmt::format("mlp {}-{}-{} x{} layers", m.in_dim, m.width, m.out_dim, m.layers);
    if (m.norm != NormKind::none) s += fmt::format(", {}", norm_kind_name(m.norm));
  }
  s += cfg.micro_batch < cfg.batch ? fmt::format(", batch {} in micro-batches of {}", cfg.batch, cfg.micro_batch)
                                   : fmt::format(", batch {}", cfg.batch);
  s += fmt::format(", {}", dtype_name(cfg.precision.compute));
  if (cfg.model == ModelKind::transformer && cfg.transformer.memory_efficient_attention)
    s += ", memory-efficient attention";
  const float dropout = cfg.model == ModelKind::mlp ? cfg.mlp.dropout : cfg.transformer.dropout;
  if (dropout > 0.f) s += fmt::format(", dropout {:g}", dropout);
  if (cfg.checkpoint.every_k_blocks > 0)
    s += cfg.checkpoint.every_k_blocks == 1 ? ", every block checkpointed"
                                            : fmt::format(", every {} blocks checkpointed", cfg.checkpoint.every_k_blocks);
  s += fmt::format(", {}", optimizer_kind_name(cfg.optimizer.kind));
  if (cfg.adapters.kind == AdapterKind::lora)
    s += fmt::format(", LoRA rank {} alpha {:g} on q and v", cfg.adapters.rank, cfg.adapters.alpha);
  if (cfg.sharding != Sharding::none) s += fmt::format(", ZeRO-{}", static_cast<int>(cfg.sharding));
  return s;
}

namespace {

std::string short_dump(const nlohmann::json& v) {
  std::string s = v.dump();
  return s.size() > 60 ? s.substr(0, 57) + "..." : s;
}

template <typename T>
T read_value(const nlohmann::json& v, const std::string& name) {
  if constexpr (std::is_same_v<T, bool>) {
    HR_ARG_CHECK(v.is_boolean(), "{}: must be true or false, got {}", name, short_dump(v));
    return v.get<bool>();
  } else if constexpr (std::is_same_v<T, std::string>) {
    HR_ARG_CHECK(v.is_string(), "{}: must be a string, got {}", name, short_dump(v));
    return v.get<std::string>();
  } else if constexpr (std::is_integral_v<T>) {
    // 64.7 is not 64, 1e308 is not an integer at all.
    HR_ARG_CHECK(v.is_number_integer(), "{}: must be an integer, got {}", name, short_dump(v));
    if (v.is_number_unsigned()) {
      const uint64_t u = v.get<uint64_t>();
      HR_ARG_CHECK(u <= static_cast<uint64_t>(std::numeric_limits<T>::max()), "{}: {} is out of range (at most {})",
                   name, u, std::numeric_limits<T>::max());
      return static_cast<T>(u);
    }
    const int64_t i = v.get<int64_t>();
    HR_ARG_CHECK(std::is_signed_v<T> || i >= 0, "{}: must not be negative, got {}", name, i);
    if constexpr (std::is_signed_v<T>)
      HR_ARG_CHECK(i >= static_cast<int64_t>(std::numeric_limits<T>::min()) &&
                       i <= static_cast<int64_t>(std::numeric_limits<T>::max()),
                   "{}: {} is out of range", name, i);
    return static_cast<T>(i);
  } else {
    static_assert(std::is_floating_point_v<T>, "get(): bool, string, integer or floating point");
    HR_ARG_CHECK(v.is_number(), "{}: must be a number, got {}", name, short_dump(v));
    const double d = v.get<double>();
    HR_ARG_CHECK(std::isfinite(d) && std::fabs(d) <= static_cast<double>(std::numeric_limits<T>::max()),
                 "{}: {} is out of range for a {}-bit floating-point field", name, short_dump(v), 8 * sizeof(T));
    return static_cast<T>(d);
  }
}

template <typename T>
void get(const nlohmann::json& j, const char* key, T& out, const std::string& path) {
  mark_asked(j, key);
  auto it = j.find(key);
  if (it == j.end()) return;
  out = read_value<T>(*it, path + key);
}
std::string get_str(const nlohmann::json& j, const char* key, const std::string& dflt, const std::string& path) {
  std::string s = dflt;
  get(j, key, s, path);
  return s;
}

// The sub-object j[key] when present (null when absent); a present section must be an object.
const nlohmann::json* section(const nlohmann::json& j, const char* key, const std::string& path) {
  mark_asked(j, key);
  auto it = j.find(key);
  if (it == j.end()) return nullptr;
  HR_ARG_CHECK(it->is_object(), "{}{}: must be an object of fields, got {}", path, key, short_dump(*it));
  return &*it;
}

void check_no_unknown_keys(const nlohmann::json& j, const std::string& path, const Asked& asked) {
  auto known = asked.keys.find(&j);
  for (auto it = j.begin(); it != j.end(); ++it) {
    const bool ok = known != asked.keys.end() && known->second.count(it.key()) > 0;
    if (!ok) {
      std::string list;
      if (known != asked.keys.end())
        for (const auto& k : known->second) list += (list.empty() ? "" : ", ") + k;
      throw InvalidArgument(fmt::format("{}{}: unknown field{}", path, it.key(),
                                        list.empty() ? std::string() : fmt::format(" (known here: {})", list)));
    }
    if (it->is_object()) check_no_unknown_keys(*it, path + it.key() + ".", asked);
  }
}

}  // namespace

StepConfig step_config_from_json(const nlohmann::json& j, const StepConfig& base) {
  HR_ARG_CHECK(j.is_object(), "step configuration: a JSON object expected");
  Asked asked;
  struct Scope {
    Asked* prev;
    explicit Scope(Asked* a) : prev(g_asked) { g_asked = a; }
    ~Scope() { g_asked = prev; }
  } scope(&asked);
  StepConfig c = base;
  c.model = parse_model_kind(get_str(j, "model", model_kind_name(base.model), ""));
  if (const nlohmann::json* mp = section(j, "mlp", "")) {
    const auto& m = *mp;
    HR_ARG_CHECK(c.model == ModelKind::mlp, "mlp: a section for the mlp, but model is {}", model_kind_name(c.model));
    get(m, "in_dim", c.mlp.in_dim, "mlp.");
    get(m, "width", c.mlp.width, "mlp.");
    get(m, "out_dim", c.mlp.out_dim, "mlp.");
    get(m, "layers", c.mlp.layers, "mlp.");
    if (const std::string norm = get_str(m, "norm", "", "mlp."); !norm.empty()) {
      try {
        c.mlp.norm = parse_norm_kind(norm);
      } catch (const InvalidArgument& e) {
        throw InvalidArgument(std::string("mlp.norm: ") + e.what());
      }
    }
    const std::string task = get_str(m, "task", mlp_task_name(base.mlp.task), "mlp.");
    HR_ARG_CHECK(task == "regression" || task == "classification",
                 "mlp.task: unknown task '{}' (expected regression or classification)", task);
    c.mlp.task = task == "regression" ? MlpTask::regression : MlpTask::classification;
    get(m, "dropout", c.mlp.dropout, "mlp.");
    get(m, "norm_eps", c.mlp.norm_eps, "mlp.");
    get(m, "bn_momentum", c.mlp.bn_momentum, "mlp.");
    get(m, "bn_virtual_batch", c.mlp.bn_virtual_batch, "mlp.");
    get(m, "fault_ln_batch_leak", c.mlp.fault_ln_batch_leak, "mlp.");
    get(m, "fault_ghost_bn_neighbour_leak", c.mlp.fault_ghost_bn_neighbour_leak, "mlp.");
    get(m, "fault_bn_recompute_channels", c.mlp.fault_bn_recompute_channels, "mlp.");
  }
  if (const nlohmann::json* tp = section(j, "transformer", "")) {
    const auto& t = *tp;
    HR_ARG_CHECK(c.model == ModelKind::transformer, "transformer: a section for the transformer, but model is {}",
                 model_kind_name(c.model));
    get(t, "vocab", c.transformer.vocab, "transformer.");
    get(t, "max_positions", c.transformer.max_positions, "transformer.");
    get(t, "d_model", c.transformer.d_model, "transformer.");
    get(t, "heads", c.transformer.heads, "transformer.");
    get(t, "layers", c.transformer.layers, "transformer.");
    get(t, "mlp_ratio", c.transformer.mlp_ratio, "transformer.");
    get(t, "dropout", c.transformer.dropout, "transformer.");
    get(t, "attn_out_dropout", c.transformer.attn_out_dropout, "transformer.");
    get(t, "attn_probs_dropout", c.transformer.attn_probs_dropout, "transformer.");
    get(t, "ln_eps", c.transformer.ln_eps, "transformer.");
    get(t, "ignore_index", c.transformer.ignore_index, "transformer.");
    const std::string att = get_str(t, "attention",
                                    base.transformer.memory_efficient_attention ? "memory_efficient" : "naive",
                                    "transformer.");
    HR_ARG_CHECK(att == "naive" || att == "memory_efficient",
                 "transformer.attention: unknown attention '{}' (expected naive or memory_efficient)", att);
    c.transformer.memory_efficient_attention = att == "memory_efficient";
  }
  get(j, "batch", c.batch, "");
  get(j, "micro_batch", c.micro_batch, "");
  get(j, "seq_len", c.seq_len, "");
  if (const nlohmann::json* pp = section(j, "precision", "")) {
    const auto& p = *pp;
    if (const std::string compute = get_str(p, "compute", "", "precision."); !compute.empty()) {
      try {
        c.precision.compute = parse_dtype(compute);
      } catch (const InvalidArgument& e) {
        throw InvalidArgument(std::string("precision.compute: ") + e.what());
      }
    }
    get(p, "master_weights", c.precision.master_weights, "precision.");
    if (const std::string ga = get_str(p, "grad_accum", "", "precision."); !ga.empty()) {
      try {
        c.precision.grad_accum = parse_dtype(ga);
      } catch (const InvalidArgument& e) {
        throw InvalidArgument(std::string("precision.grad_accum: ") + e.what());
      }
    }
    if (const nlohmann::json* sp = section(p, "scaler", "precision.")) {
      const auto& s = *sp;
      get(s, "enabled", c.precision.scaler.enabled, "precision.scaler.");
      get(s, "dynamic", c.precision.scaler.dynamic, "precision.scaler.");
      get(s, "init_scale", c.precision.scaler.init_scale, "precision.scaler.");
      get(s, "growth", c.precision.scaler.growth, "precision.scaler.");
      get(s, "backoff", c.precision.scaler.backoff, "precision.scaler.");
      get(s, "growth_interval", c.precision.scaler.growth_interval, "precision.scaler.");
    }
  }
  if (const std::string ln = get_str(j, "loss_norm", "", ""); !ln.empty()) c.loss_norm = parse_loss_normalization(ln);
  get(j, "loss_multiplier", c.loss_multiplier, "");
  if (const nlohmann::json* kp = section(j, "checkpoint", "")) {
    const auto& k = *kp;
    get(k, "every_k_blocks", c.checkpoint.every_k_blocks, "checkpoint.");
    get(k, "fresh_rng_on_recompute", c.checkpoint.fresh_rng_on_recompute, "checkpoint.");
    get(k, "update_bn_stats_on_recompute", c.checkpoint.update_bn_stats_on_recompute, "checkpoint.");
    get(k, "fault_flip_mask_elements", c.checkpoint.fault_flip_mask_elements, "checkpoint.");
    get(k, "fault_extra_block_forwards", c.checkpoint.fault_extra_block_forwards, "checkpoint.");
    get(k, "fault_never_recompute", c.checkpoint.fault_never_recompute, "checkpoint.");
    get(k, "fault_grad_ulp_elements", c.checkpoint.fault_grad_ulp_elements, "checkpoint.");
    get(k, "fault_keep_recomputed", c.checkpoint.fault_keep_recomputed, "checkpoint.");
    get(k, "fault_off_checkpoints_every_block", c.checkpoint.fault_off_checkpoints_every_block, "checkpoint.");
  }
  if (const nlohmann::json* op = section(j, "optimizer", "")) {
    const auto& o = *op;
    const std::string kind = get_str(o, "kind", optimizer_kind_name(base.optimizer.kind), "optimizer.");
    HR_ARG_CHECK(kind == "sgd" || kind == "adamw" || kind == "adamw8bit" ||
                     (kind == "custom" && base.optimizer.kind == OptimizerKind::custom),
                 "optimizer.kind: unknown optimizer '{}' (expected sgd, adamw or adamw8bit)", kind);
    if (kind == "sgd") c.optimizer.kind = OptimizerKind::sgd;
    if (kind == "adamw") c.optimizer.kind = OptimizerKind::adamw;
    if (kind == "adamw8bit") c.optimizer.kind = OptimizerKind::adamw8bit;
    if (const nlohmann::json* q = section(o, "adamw8bit", "optimizer.")) {
      get(*q, "block_size", c.optimizer.adamw8bit.block_size, "optimizer.adamw8bit.");
    }
    if (const nlohmann::json* sgd = section(o, "sgd", "optimizer.")) {
      get(*sgd, "lr", c.optimizer.sgd.lr, "optimizer.sgd.");
      get(*sgd, "momentum", c.optimizer.sgd.momentum, "optimizer.sgd.");
      get(*sgd, "weight_decay", c.optimizer.sgd.weight_decay, "optimizer.sgd.");
    }
    if (const nlohmann::json* adamw = section(o, "adamw", "optimizer.")) {
      get(*adamw, "lr", c.optimizer.adamw.lr, "optimizer.adamw.");
      get(*adamw, "beta1", c.optimizer.adamw.beta1, "optimizer.adamw.");
      get(*adamw, "beta2", c.optimizer.adamw.beta2, "optimizer.adamw.");
      get(*adamw, "eps", c.optimizer.adamw.eps, "optimizer.adamw.");
      get(*adamw, "weight_decay", c.optimizer.adamw.weight_decay, "optimizer.adamw.");
    }
  }
  if (const nlohmann::json* ap = section(j, "adapters", "")) {
    const std::string kind =
        get_str(*ap, "kind", base.adapters.kind == AdapterKind::none ? "none" : "lora", "adapters.");
    HR_ARG_CHECK(kind == "none" || kind == "lora", "adapters.kind: unknown adapter '{}' (expected none or lora)", kind);
    c.adapters.kind = kind == "none" ? AdapterKind::none : AdapterKind::lora;
    get(*ap, "rank", c.adapters.rank, "adapters.");
    get(*ap, "alpha", c.adapters.alpha, "adapters.");
    get(*ap, "b_init_std", c.adapters.b_init_std, "adapters.");
  }
  get(j, "init_seed", c.init_seed, "");
  get(j, "dropout_seed", c.dropout_seed, "");
  // parse_dropout_keying names the field in its error.
  if (const std::string keying = get_str(j, "dropout_keying", "", ""); !keying.empty())
    c.dropout_keying = parse_dropout_keying(keying);
  if (const std::string sh = get_str(j, "sharding", "", ""); !sh.empty()) c.sharding = parse_sharding(sh);
  // to_json writes accum_steps (derived); a file may repeat it but not contradict it.
  int64_t accum_steps = 0;
  get(j, "accum_steps", accum_steps, "");
  if (j.contains("accum_steps"))
    HR_ARG_CHECK(accum_steps == c.accum_steps(), "accum_steps: {} contradicts batch {} / micro_batch {} = {}",
                 accum_steps, c.batch, c.micro_batch, c.accum_steps());
  check_no_unknown_keys(j, "", asked);
  return c;
}

}  // namespace hr
