// Tensor dumps for framework developers (see dump.hpp).
#include "harness/dump/dump.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

#include "harness/check.hpp"
#include "harness/data/packing.hpp"
#include "harness/data/synthetic.hpp"
#include "harness/dist/dp_dump.hpp"
#include "harness/kernel_calls.hpp"
#include "harness/output.hpp"
#include "harness/step/train_step.hpp"
#include "kernels/dropout/dropout.hpp"
#include "kernels/optim/quant8_math.hpp"

namespace hr {
namespace {

std::string dropout_site(const StepConfig& cfg, int64_t block, int64_t kind) {
  if (cfg.model == ModelKind::mlp) return fmt::format("layers.{}.dropout", block);
  if (kind == static_cast<int64_t>(DropoutSite::attn_probs)) return fmt::format("h.{}.attn.attn_dropout", block);
  return kind == static_cast<int64_t>(DropoutSite::attn_out) ? fmt::format("h.{}.attn.resid_dropout", block)
                                                             : fmt::format("h.{}.mlp.dropout", block);
}

float dropout_p(const StepConfig& cfg, int64_t kind) {
  if (cfg.model == ModelKind::mlp) return cfg.mlp.dropout;
  if (kind == static_cast<int64_t>(DropoutSite::attn_probs)) return cfg.transformer.attn_probs_p();
  return kind == static_cast<int64_t>(DropoutSite::attn_out) ? cfg.transformer.attn_out_p() : cfg.transformer.dropout;
}

// The rule every mask's Philox key and draw index follow, written so that each
// mask can be regenerated from conventions.json alone (dropout_keys.hpp).
nlohmann::ordered_json dropout_conventions(const StepConfig& cfg) {
  nlohmann::ordered_json d;
  d["seed"] = cfg.dropout_seed;
  d["keying"] = dropout_keying_name(cfg.dropout_keying);
  d["philox"] =
      "Philox4x32-10, key k (64 bits: k0 = low word, k1 = high word), 10 rounds, M0 = 0xD2511F53, "
      "M1 = 0xCD9E8D57, W0 = 0x9E3779B9, W1 = 0xBB67AE85. Draw n of key k (cuRAND's host-generator order): "
      "block b = n / 4, counter = {x: low 32 bits of b / 65536, y: high 32 bits of b / 65536, z: b % 65536, "
      "w: 0}, the draw is word n % 4 (x, y, z, w) of Philox(counter, k)";
  d["keep"] = "element kept iff draw >= round(p * 2^32) (unsigned 32-bit compare); kept values are scaled by 1/(1-p)";
  if (cfg.dropout_keying == DropoutKeying::per_sample) {
    d["key"] =
        "seed + pass * 0x9E3779B97F4A7C15 (mod 2^64); pass = s - 1 for step s (0 for the one pass of a dump without "
        "steps)";
    d["draw_index"] =
        "n = site * 2^48 + sample * 2^32 + element, where sample is the row's index in the whole batch (not in its "
        "micro-batch), element the row-major index within that sample's part of the tensor, and site = 4 * block + "
        "kind";
    d["site_kind"] = cfg.model == ModelKind::mlp
                         ? nlohmann::ordered_json{{"layers.<block>.dropout", 0}}
                         : nlohmann::ordered_json{{"h.<block>.attn.attn_dropout", 0},
                                                  {"h.<block>.attn.resid_dropout", 1},
                                                  {"h.<block>.mlp.dropout", 2}};
    d["sample_rows"] = cfg.model == ModelKind::mlp
                           ? "one row of [rows, width] per sample"
                           : "attn_dropout: row b of the probabilities [batch, heads, query, key] (heads * seq_len^2 "
                             "elements per sample); the others: seq_len consecutive rows of [tokens, d_model]";
  } else {
    d["key"] = "seed";
    d["draw_index"] =
        "n = offset + element over the whole micro-batch tensor; offsets run on in draw order through the step: "
        "micro-batch by micro-batch, block by block, site by site (attention probabilities, attention output, MLP "
        "output), each draw advancing the offset by its element count rounded up to a multiple of 4; the offset "
        "starts at 0 and runs on from one step to the next";
  }
  d["p_zero_sites"] =
      "a site with p = 0 draws nothing: no mask, and (running_offset) the offset does not advance; per_sample draw "
      "indices do not depend on other sites at all";
  return d;
}


SafetensorsEntry i32_entry(const std::string& name, const std::vector<int64_t>& v) {
  SafetensorsEntry e;
  e.name = name;
  e.dtype = "I32";
  e.shape = {static_cast<int64_t>(v.size())};
  e.bytes.resize(v.size() * sizeof(int32_t));
  for (size_t i = 0; i < v.size(); ++i) {
    const int32_t x = static_cast<int32_t>(v[i]);
    std::memcpy(e.bytes.data() + i * sizeof x, &x, sizeof x);
  }
  return e;
}

SafetensorsEntry f32_entry(const std::string& name, const std::vector<float>& v, Shape shape) {
  SafetensorsEntry e;
  e.name = name;
  e.dtype = "F32";
  e.shape = std::move(shape);
  e.bytes.resize(v.size() * sizeof(float));
  if (!v.empty()) std::memcpy(e.bytes.data(), v.data(), e.bytes.size());
  return e;
}

// The sequences a packed dump draws when no lengths are given: in order from the
// length distribution, the longest prefix (by bisection) that first-fit decreasing
// still packs into `rows` rows.
std::vector<int64_t> packed_lengths(int64_t rows, int64_t seq_len, uint64_t seed) {
  const int64_t most = std::min<int64_t>(rows * seq_len, int64_t{1} << 20);
  const std::vector<int64_t> all = sample_lengths(LengthDistribution{}.scaled(seq_len), most, seed);
  const auto fits = [&](int64_t n) {
    const std::vector<int64_t> head(all.begin(), all.begin() + n);
    return pack_first_fit_decreasing(head, seq_len).rows <= rows;
  };
  int64_t lo = 1, hi = most;  // fits(lo) always: one sequence takes one row
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo + 1) / 2;
    if (fits(mid)) lo = mid;
    else hi = mid - 1;
  }
  return std::vector<int64_t>(all.begin(), all.begin() + lo);
}

nlohmann::ordered_json batch_conventions(const StepConfig& cfg, const DumpOptions& opt) {
  nlohmann::ordered_json b;
  b["data_seed"] = opt.data_seed;
  b["seed_per_step"] = "step s (1-based) draws its batch from data_seed + s - 1; a dump without steps from data_seed";
  if (cfg.model == ModelKind::mlp) {
    b["tensors"] = {{"x", "fp32 [batch, in_dim]"},
                    {"targets", cfg.mlp.task == MlpTask::regression ? "fp32 [batch, out_dim]" : "int32 [batch] classes"}};
    b["micro_batches"] = "micro-batch m holds rows [m * micro_batch, (m + 1) * micro_batch)";
    return b;
  }
  b["layout"] = dump_layout_name(opt.layout);
  b["lengths"] = opt.lengths.empty()
                     ? (opt.layout == DumpLayout::packed
                            ? "drawn: sequences in order from the length distribution, the longest prefix that first-fit "
                              "decreasing packs into batch rows"
                            : "drawn: one per row from the length distribution (log-normal, p95 and max scaled to "
                              "seq_len)")
                     : "given (--lengths)";
  b["tensors"] = {
      {"ids", "int32 [batch, seq_len] token ids (padding: 0)"},
      {"pos", "int32 [batch, seq_len] positions into wpe"},
      {"targets", "int32 [batch, seq_len] the next token of the same sequence; ignore_index at each sequence's last "
                  "token and on padding"},
      {"key_valid_len", "int32 [batch] padded layout: the row's length; keys at or past it are padding"},
      {"segment_ids", "int32 [batch, seq_len] packed layout: the sequence each token belongs to, counting from 0 in "
                      "its row; the row's unused tail is a segment of its own"},
      {"sequence_length", "int32 [sequences] each sequence's length, in the order drawn or given"},
      {"sequence_row", "int32 [sequences] the row it lies in"},
      {"sequence_offset", "int32 [sequences] its first token's column"}};
  if (opt.layout == DumpLayout::packed) {
    b["packing"] =
        "first-fit decreasing: sequences sorted by length (longest first, ties in input order), each into the first "
        "row with room, a new row when none has; rows the sequences do not need are all padding";
    b["positions"] = "restart at 0 at each sequence's first token (pos = column - sequence_offset); the row's "
                     "unused tail, a segment of its own, restarts at 0 too";
    b["mask"] = "block-diagonal causal: query t attends key s iff s <= t and segment_ids[b, s] == segment_ids[b, t]";
  } else {
    b["positions"] = "0 .. seq_len - 1 in every row";
    b["mask"] = "causal with padding: query t attends key s iff s <= t and s < key_valid_len[b]";
  }
  b["micro_batches"] = "micro-batch m holds rows [m * micro_batch, (m + 1) * micro_batch)";
  return b;
}

const char* map_kind_name(q8::MapKind k) {
  switch (k) {
    case q8::MapKind::dynamic_signed: return "dynamic_signed";
    case q8::MapKind::dynamic_unsigned: return "dynamic_unsigned";
    case q8::MapKind::linear_signed: return "linear_signed";
    case q8::MapKind::linear_unsigned: return "linear_unsigned";
  }
  return "?";
}

// The weight decay rule and the update, as the optimizer applies them.
nlohmann::ordered_json optimizer_conventions(const StepConfig& cfg, TrainStep& step) {
  nlohmann::ordered_json o;
  const OptimizerConfig& oc = cfg.optimizer;
  o["kind"] = optimizer_kind_name(oc.kind);
  nlohmann::ordered_json no_decay = nlohmann::ordered_json::array();
  for (const Param& p : step.params().all())
    if (p.trainable && !p.weight_decay) no_decay.push_back(p.name);
  o["no_weight_decay"] = no_decay;
  o["step_count"] =
      "t counts applied steps from 1; a skipped step (non-finite gradients) changes no parameter and no state and does "
      "not count";
  o["arithmetic"] = "fp32, element by element, on the fp32 masters (16-bit compute copies are then the masters rounded "
                    "to nearest even)";
  if (oc.kind == OptimizerKind::sgd) {
    o["hyperparameters"] = {{"lr", oc.sgd.lr}, {"momentum", oc.sgd.momentum}, {"weight_decay", oc.sgd.weight_decay}};
    o["update"] = "d = g + weight_decay * p; with momentum > 0: buf = momentum * buf + d (buf starts at 0), d = buf; "
                  "p = p - lr * d";
    o["state"] = "momentum > 0: <param>.momentum_buffer fp32, as the parameter; none otherwise";
    return o;
  }
  const ops::AdamWConfig& a = oc.adamw;
  o["hyperparameters"] = {
      {"lr", a.lr}, {"beta1", a.beta1}, {"beta2", a.beta2}, {"eps", a.eps}, {"weight_decay", a.weight_decay}};
  o["update"] =
      "in this order, each operation in fp32 unless said: p = p * (1 - lr * weight_decay); m = beta1 m + (1 - beta1) "
      "g; v = beta2 v + (1 - beta2) g g; denom = sqrt(v) / c2 + eps; p = p - s1 * (m / denom) (m / denom first, as "
      "torch.optim.AdamW's addcdiv), where s1 = fp32(lr / (1 - beta1^t)) and c2 = fp32(sqrt(1 - beta2^t)) are "
      "computed in double from the fp32 hyperparameters";
  if (oc.kind == OptimizerKind::adamw) {
    o["state"] = "<param>.exp_avg (m) and <param>.exp_avg_sq (v), fp32, as the parameter; both start at 0";
    return o;
  }
  const ops::AdamW8bitOptions& q = oc.adamw8bit;
  o["state"] =
      "tensors of at least min_8bit_numel elements: <param>.exp_avg.codes and <param>.exp_avg_sq.codes (uint8, as the "
      "parameter) with <param>.exp_avg.absmax and <param>.exp_avg_sq.absmax (fp32, one per block of block_size "
      "consecutive row-major elements, the last block shorter); smaller tensors <param>.exp_avg and <param>.exp_avg_sq "
      "in fp32; maps.exp_avg and maps.exp_avg_sq the two 256-entry codebooks (fp32 normalised values, code i -> "
      "value i, sorted)";
  o["block_size"] = q.block_size;
  o["min_8bit_numel"] = q8::kMin8bitNumel;
  o["maps"] = {{"exp_avg", map_kind_name(q.m_map)}, {"exp_avg_sq", map_kind_name(q.v_map)}};
  o["dynamic_map"] =
      "positive half: decade d = 0..6 covers [0.1, 1) * 10^(d - 6) with n * 2^d values, the midpoints of n * 2^d "
      "equal steps of that decade (n = 1 signed, 2 unsigned); signed: codes 0..126 the negatives (mirror), 127 zero, "
      "128..254 the positives, 255 one; unsigned: 0 zero, 1..254 the positives, 255 one";
  o["quantisation"] =
      "per block: absmax = max |x| over the block; code = the nearest map value to x / absmax (a tie to the lower "
      "code; x / absmax taken as 0 when absmax is 0); value = map[code] * absmax";
  o["step_8bit"] = "each element: m and v decoded with the block's absmax, the AdamW update above in fp32 (the "
                   "parameter steps from those fp32 moments), then both moments encoded again with their blocks' new "
                   "absmax; codes and absmax all start at 0";
  return o;
}

nlohmann::ordered_json scaler_conventions(const StepConfig& cfg) {
  const LossScalerConfig& s = cfg.precision.scaler;
  nlohmann::ordered_json j;
  j["applies"] = cfg.loss_scaling();
  if (!cfg.loss_scaling()) {
    j["rule"] = "no loss scale (fp32 or bf16 compute, or the scaler off): scale 1";
    return j;
  }
  j["init_scale"] = s.init_scale;
  j["dynamic"] = s.dynamic;
  j["growth"] = s.growth;
  j["backoff"] = s.backoff;
  j["growth_interval"] = s.growth_interval;
  j["rule"] =
      "torch.amp.GradScaler: every micro-batch's loss is multiplied by the scale before its backward pass; the fp32 "
      "gradients summed over the window are multiplied by 1 / scale once (fp32 reciprocal), then checked: any inf or "
      "NaN skips the step (no parameter or state changes), scale *= backoff and the growth tracker goes to 0; "
      "otherwise the tracker counts up and at growth_interval scale *= growth and the tracker goes to 0";
  j["per_step"] = "steps[i].loss_scale is the scale step i's backward passes ran at (before its update; the first "
                  "step's is init_scale); loss_scale_after and growth_tracker_after are the scaler's after its update, "
                  "which the next step runs at";
  return j;
}

nlohmann::ordered_json adapter_conventions(const StepConfig& cfg) {
  const AdapterConfig& a = cfg.adapters;
  const bool mlp = cfg.model == ModelKind::mlp;
  nlohmann::ordered_json j;
  j["kind"] = "lora";
  j["rank"] = a.rank;
  j["alpha"] = a.alpha;
  j["scale"] = a.alpha / static_cast<float>(a.rank);
  j["adapted"] = mlp ? "layers.{i}.weight of every layer but the last: y = x W^T + b + scale (x A^T) B^T, with "
                       "layers.{i}.lora_A [r, in] and layers.{i}.lora_B [out, r]"
                     : "h.{i}.attn.q and h.{i}.attn.v: y = x W^T + b + scale (x A^T) B^T, with "
                       "h.{i}.attn.q.lora_A [r, in] and h.{i}.attn.q.lora_B [out, r] (v likewise)";
  j["init"] = a.b_init_std > 0.f
                  ? fmt::format("A as init.per_parameter says; B normal(0, {}) on request "
                                "(adapters.b_init_std), not LoRA's zero B, so that A's gradient is not zero",
                                a.b_init_std)
                  : "A as init.per_parameter says; B zeros (LoRA's init: the adapted model starts as the base, and "
                    "A's gradient at the first step is 0)";
  j["frozen"] = "every base parameter: no gradient in gradients.safetensors; only the adapters train";
  j["weight_decay"] = "both adapters take the optimizer's weight decay (optimizer.no_weight_decay lists none of them)";
  return j;
}

struct StepRecord {
  int64_t step = 0;
  uint64_t data_seed = 0;
  double loss = 0;
  StepResult result;
  bool overflow_injected = false;
  double scale_after = 1;
  int64_t tracker_after = 0;
  int64_t applied = 0;
  std::vector<double> divisors;
  int64_t sparse = 0;
};

nlohmann::ordered_json number_or_null(double v) {
  return std::isfinite(v) ? nlohmann::ordered_json(v) : nlohmann::ordered_json(nullptr);
}

nlohmann::ordered_json conventions(const StepConfig& cfg, const DumpOptions& opt, TrainStep& step,
                                   const std::vector<StepRecord>& records) {
  nlohmann::ordered_json j;
  j["format"] = "headroom.dump/2";
  j["model"] = model_kind_name(cfg.model);
  j["config"] = nlohmann::json(cfg);
  j["weight_layout"] = "[out, in]: y = x W^T + b, as torch.nn.Linear; embeddings [rows, d_model]";
  j["gelu"] = "tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) (torch approximate='tanh')";
  if (cfg.model == ModelKind::transformer) {
    const TransformerConfig& t = cfg.transformer;
    j["architecture"] =
        "pre-LN decoder: x = wte[ids] + wpe[pos]; per block: x = x + resid_dropout(attn.proj(attention(ln1(x)))) "
        "with attention = attn_dropout(softmax(q k^T * scale + mask)) v; "
        "x = x + dropout(mlp.proj(gelu(mlp.fc(ln2(x))))); then ln_f and lm_head (no bias, untied)";
    j["layernorm"] = {{"eps", t.ln_eps}, {"variance", "biased (divide by C)"}, {"affine", true}};
    j["attention"] = {
        {"heads", t.heads},
        {"head_dim", t.head_dim()},
        {"projections", "separate q, k, v linears [d_model, d_model]; head h uses features [h*D, (h+1)*D) of q, k "
                        "and v, and its output goes to features [h*D, (h+1)*D) of the concatenation attn.proj reads"},
        {"key_bias", "h.<i>.attn.k.bias adds the same q . b_k to every score of a query's row, which softmax "
                     "removes: its gradient is 0 in exact arithmetic and holds only fp32 rounding noise (about 1e-11); "
                     "compare it by absolute size, and expect AdamW to move it anyway (its step is lr g / (|g| + eps))"},
        {"scale", 1.0 / std::sqrt(static_cast<double>(t.head_dim()))},
        {"scale_formula", "1/sqrt(head_dim)"},
        {"mask",
         "query t may attend key s iff s <= t (causal) and s < key_valid_len[b] (padding, when given) and "
         "segment_ids[b, s] == segment_ids[b, t] (packing, when given); masked probabilities are exactly 0, a row "
         "with every key masked is all zeros"},
        {"impl", t.memory_efficient_attention ? "memory_efficient" : "naive"},
        {"impl_note", t.memory_efficient_attention
                          ? "tiled online softmax: the forward keeps each row's log-sum-exp, not the T x T "
                            "probabilities, and the backward recomputes them; the same function as naive attention, "
                            "summed in another order"
                          : "the T x T probabilities are formed and kept for the backward pass"}};
    j["loss"] = {{"kind", "cross_entropy"},
                 {"ignore_index", t.ignore_index},
                 {"reduction", "sum over targets != ignore_index, divided by the micro-batch's divisor, times "
                               "multiplier"}};
  } else {
    const MlpConfig& m = cfg.mlp;
    j["architecture"] = "per block l < layers-1: x = dropout(gelu(norm(layers.l(x)))); prediction = layers.{L-1}(x)";
    j["norm"] = {{"kind", norm_kind_name(m.norm)},
                 {"eps", m.norm_eps},
                 {"batchnorm_momentum", m.bn_momentum},
                 {"batchnorm_virtual_batch", m.bn_virtual_batch},
                 {"batchnorm_running_var", "unbiased (N/(N-1)); normalisation uses the biased batch variance"}};
    j["loss"] = {{"kind", m.task == MlpTask::regression ? "mse" : "cross_entropy"},
                 {"reduction", m.task == MlpTask::regression
                                   ? "sum of (pred - target)^2 over elements, divided by the micro-batch's divisor, "
                                     "times multiplier"
                                   : "sum over rows, divided by the micro-batch's divisor, times multiplier"}};
  }
  j["loss"]["normalization"] = loss_normalization_name(cfg.loss_norm);
  j["loss"]["divisor"] =
      "mean_div_k: K x the micro-batch's real items; sum_div_window_items: the window's real items (the same for "
      "every micro-batch); real items are targets != ignore_index (transformer), rows (classification) or output "
      "elements (regression); K = batch / micro_batch";
  j["loss"]["empty_micro_batch"] =
      "a micro-batch with no real item adds 0 to the loss and to every gradient (its divisor is taken as 1; "
      "PyTorch's mean over no element would give NaN)";
  j["loss"]["multiplier"] = cfg.loss_multiplier;
  j["loss"]["step_loss"] = "the sum of the micro-batches' losses (without the loss scale)";
  if (cfg.model == ModelKind::transformer) {
    // A language-model micro-batch with fewer than kMinRealTargets real targets says
    // little about a loss or its gradients: the dump says how many it holds.
    j["loss"]["min_real_targets_per_micro_batch"] = kMinRealTargets;
  }
  j["loss"]["sparse_note"] =
      "a language-model micro-batch with fewer than min_real_targets_per_micro_batch real targets says little about "
      "a loss or its gradients; sparse_micro_batches counts them";
  if (opt.steps > 0) j["loss"]["per_step"] = "each step's loss and divisor_per_micro_batch are in steps[i]";
  if (opt.steps == 0) {
    const StepRecord& r = records.front();
    j["loss"]["divisor_per_micro_batch"] = r.divisors;
    if (cfg.model == ModelKind::transformer) j["loss"]["sparse_micro_batches"] = r.sparse;
    j["loss"]["value"] = number_or_null(r.loss);
  }
  j["accumulation"] = {{"batch", cfg.batch}, {"micro_batch", cfg.micro_batch}, {"accum_steps", cfg.accum_steps()},
                       {"gradients", "fp32, summed over micro-batches, unscaled"}};
  j["batch"] = batch_conventions(cfg, opt);
  const float p = cfg.model == ModelKind::transformer ? cfg.transformer.dropout : cfg.mlp.dropout;
  const bool any = p > 0 || (cfg.model == ModelKind::transformer &&
                             (cfg.transformer.attn_out_p() > 0 || cfg.transformer.attn_probs_p() > 0));
  j["dropout"] = dropout_conventions(cfg);
  j["dropout"]["p"] = p;
  if (cfg.model == ModelKind::transformer) {
    j["dropout"]["p_attn_probs"] = cfg.transformer.attn_probs_p();
    j["dropout"]["p_attn_out"] = cfg.transformer.attn_out_p();
    j["dropout"]["p_sources"] =
        "p is config transformer.dropout (the MLP output); p_attn_out and p_attn_probs are the applied values of "
        "config attn_out_dropout and attn_probs_dropout, where -1 means: as dropout (attention probabilities: 0 "
        "with memory-efficient attention, which applies no dropout there)";
  }
  j["dropout"]["masks"] = any ? "dropout_masks.safetensors: <site>/micro_<m>, uint8 1 = kept, in the shape of the "
                                "tensor it masks"
                              : "none (p = 0)";
  j["checkpointing"] = {
      {"policy", nlohmann::json(cfg)["checkpoint"]},
      {"effect", "none on the numbers: a recomputed segment replays its forward's dropout draws and BatchNorm "
                 "statistics, so losses and gradients are those of the step without checkpointing, bit for bit"}};
  if (cfg.adapters.kind == AdapterKind::lora) j["adapters"] = adapter_conventions(cfg);
  nlohmann::ordered_json per_param = nlohmann::ordered_json::object();
  for (const Param& prm : step.params().all()) per_param[prm.name] = prm.init;
  j["init"] = {{"seed", cfg.init_seed},
               {"rng", "Philox4x32-10; normal by Box-Muller over pairs of uniforms in (0, 1]; parameter k draws "
                       "from offset k * 2^40"},
               {"per_parameter", per_param}};
  j["precision"] = {{"compute", dtype_name(cfg.precision.compute)},
                    {"master_weights", cfg.precision.master_weights},
                    {"weights_file", "fp32 masters (the compute copies are these rounded to the compute dtype; after "
                                     "a step, 16-bit copies are written too as <param>.compute)"},
                    {"loss_scale", records.front().result.loss_scale}};
  j["loss_scaler"] = scaler_conventions(cfg);
  j["optimizer"] = optimizer_conventions(cfg, step);
  if (opt.steps > 0) {
    nlohmann::ordered_json steps = nlohmann::ordered_json::array();
    for (const StepRecord& r : records) {
      nlohmann::ordered_json s;
      s["step"] = r.step;
      s["folder"] = fmt::format("step_{}", r.step);
      s["data_seed"] = r.data_seed;
      s["loss"] = number_or_null(r.loss);
      s["overflow_injected"] = r.overflow_injected;
      s["found_nonfinite"] = r.result.found_nonfinite;
      s["skipped"] = r.result.skipped;
      s["optimizer_t"] = r.result.skipped ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(r.applied);
      s["loss_scale"] = r.result.loss_scale;
      s["loss_scale_after"] = r.scale_after;
      s["growth_tracker_after"] = r.tracker_after;
      s["divisor_per_micro_batch"] = r.divisors;
      if (cfg.model == ModelKind::transformer) s["sparse_micro_batches"] = r.sparse;
      steps.push_back(s);
    }
    j["steps"] = steps;
    j["step_files"] = {
        {"batch.safetensors", "the step's batch"},
        {"loss.safetensors", "loss: F64, the step loss (2^64 times larger at an injected overflow)"},
        {"gradients.safetensors", "the fp32 gradients the step unscaled and checked (non-finite at a skipped step)"},
        {"dropout_masks.safetensors", "the step's masks, when a site has p > 0"},
        {"weights.safetensors", "after the step: fp32 masters under the parameters' names, 16-bit compute copies as "
                                "<param>.compute, the model's buffers"},
        {"optimizer_state.safetensors", "after the step, as stored (see optimizer.state)"}};
    j["overflow_injection"] =
        "at each step in overflow_steps, every micro-batch's loss is multiplied by 2^64 as well (loss.multiplier "
        "too): the fp16 backward passes overflow, the step's gradients hold inf or NaN and its loss is that "
        "large";
    j["overflow_steps"] = opt.overflow_steps;
  }
  if (opt.ranks > 0) {
    int64_t total = 0;
    for (const Param& p : step.params().all())
      if (p.trainable) total += p.master.numel();
    nlohmann::ordered_json shards = nlohmann::ordered_json::array();
    for (const auto& [b, e] : dist::zero1_shards(total, opt.ranks)) shards.push_back({b, e});
    j["data_parallel"] = {
        {"ranks", opt.ranks},
        {"rows_per_rank", cfg.batch / opt.ranks},
        {"folders", "rank_<r>/step_<s>/: batch, gradients_local, gradients, optimizer_state, weights (.safetensors)"},
        {"slice", "rank r takes rows [r * rows_per_rank, (r + 1) * rows_per_rank) of each step's batch, in "
                  "micro-batches of micro_batch rows"},
        {"gradients_local", "what rank r sent to the all-reduce: the sum over its micro-batches of each loss summed "
                            "over real items (divisor 1), times multiplier"},
        {"gradients", "the all-reduced sums (MPI_Allreduce, fp32, once per window) divided by the window's real "
                      "items over every rank (all-reduced too): equal, within DP-1's bound, to the single-process "
                      "gradients of the whole batch at the top of the dump (normalization sum_div_window_items)"},
        {"zero1",
         {{"flat_order", "the trainable parameters in weights.safetensors' order, each row-major"},
          {"total_elements", total},
          {"shard_elements", (total + opt.ranks - 1) / opt.ranks},
          {"shards", shards},
          {"optimizer_state", "exp_avg and exp_avg_sq, fp32, the moments of rank r's shard [begin, end) of the "
                              "flat parameters (one zero element when the shard is empty)"},
          {"step", "each rank updates its shard's elements by the AdamW above (weight decay per parameter) and the "
                   "updated shards are all-gathered into every rank's parameters: every rank's weights equal the "
                   "single-process step's within DP-1's bound"}}}};
  }
  return j;
}

// What --overflow-steps multiplies every micro-batch's loss by: every fp16 gradient it
// reaches overflows at any loss scale above 2^-40 (the loss kernels divide by
// count / multiplier, so the factor must stay finite).
constexpr double kDumpOverflowMultiplier = 0x1p64;

bool is_overflow_step(const DumpOptions& opt, int64_t s) {
  return std::find(opt.overflow_steps.begin(), opt.overflow_steps.end(), s) != opt.overflow_steps.end();
}

const std::map<std::string, std::string>& file_metadata() {
  static const std::map<std::string, std::string> meta{{"format", "pt"}, {"producer", "headroom dump"}};
  return meta;
}

}  // namespace

const char* dump_layout_name(DumpLayout l) { return l == DumpLayout::packed ? "packed" : "padded"; }

DumpLayout parse_dump_layout(const std::string& s) {
  if (s == "padded") return DumpLayout::padded;
  if (s == "packed") return DumpLayout::packed;
  throw InvalidArgument(fmt::format("--layout: unknown layout '{}' (expected padded or packed)", s));
}

void validate(const DumpOptions& opt, const StepConfig& cfg) {
  HR_ARG_CHECK(opt.steps >= 0 && opt.steps <= kMaxDumpSteps, "--steps: {} must be in [0, {}]", opt.steps,
               kMaxDumpSteps);
  for (int64_t s : opt.overflow_steps) {
    HR_ARG_CHECK(opt.steps > 0, "--overflow-steps: needs --steps (an overflow skips an optimizer step)");
    HR_ARG_CHECK(s >= 1 && s <= opt.steps, "--overflow-steps: {} is not one of the steps 1..{}", s, opt.steps);
    HR_ARG_CHECK(cfg.loss_scaling(), "--overflow-steps: needs fp16 with the loss scaler (--dtype fp16), which skips "
                                     "an overflowing step; {} has no scaler to show",
                 dtype_name(cfg.precision.compute));
  }
  const bool lm = cfg.model == ModelKind::transformer;
  HR_ARG_CHECK(lm || opt.layout == DumpLayout::padded, "--layout: packed needs the transformer (the mlp has no "
                                                       "sequences)");
  HR_ARG_CHECK(lm || opt.lengths.empty(), "--lengths: the mlp has no sequences");
  for (int64_t len : opt.lengths)
    HR_ARG_CHECK(len >= 1 && len <= cfg.seq_len, "--lengths: {} is outside [1, seq_len {}]", len, cfg.seq_len);
  if (lm && !opt.lengths.empty() && opt.layout == DumpLayout::padded)
    HR_ARG_CHECK(static_cast<int64_t>(opt.lengths.size()) == cfg.batch,
                 "--lengths: {} lengths for {} rows; the padded layout takes one per row (or --layout packed)",
                 opt.lengths.size(), cfg.batch);
  if (lm && !opt.lengths.empty() && opt.layout == DumpLayout::packed) {
    const PackPlan plan = pack_first_fit_decreasing(opt.lengths, cfg.seq_len);
    HR_ARG_CHECK(plan.rows <= cfg.batch, "--lengths: the {} sequences need {} rows of {} tokens; the batch has {}",
                 opt.lengths.size(), plan.rows, cfg.seq_len, cfg.batch);
  }
  HR_ARG_CHECK(opt.ranks >= 0 && opt.ranks <= kMaxDumpRanks, "--ranks: {} must be in [1, {}]", opt.ranks,
               kMaxDumpRanks);
  if (opt.ranks > 0) {
    HR_ARG_CHECK(cfg.batch % opt.ranks == 0, "--ranks: batch {} is not divisible by {} ranks", cfg.batch, opt.ranks);
    HR_ARG_CHECK((cfg.batch / opt.ranks) % cfg.micro_batch == 0,
                 "--ranks: micro_batch {} does not divide the {} rows per rank", cfg.micro_batch,
                 cfg.batch / opt.ranks);
    HR_ARG_CHECK(cfg.precision.compute == DType::f32, "--ranks: data parallel dumps run in fp32 (--dtype {} given)",
                 dtype_name(cfg.precision.compute));
    HR_ARG_CHECK(cfg.optimizer.kind == OptimizerKind::adamw,
                 "--ranks: the ranks shard AdamW's moments (ZeRO-1); optimizer.kind is {}",
                 optimizer_kind_name(cfg.optimizer.kind));
    HR_ARG_CHECK(cfg.adapters.kind == AdapterKind::none, "--ranks: data parallel dumps train the whole model (no "
                                                         "adapters)");
    HR_ARG_CHECK(opt.layout == DumpLayout::padded, "--ranks: data parallel dumps use the padded layout");
    const bool dropout = cfg.model == ModelKind::mlp
                             ? cfg.mlp.dropout > 0.f
                             : cfg.transformer.dropout > 0.f || cfg.transformer.attn_out_p() > 0.f ||
                                   cfg.transformer.attn_probs_p() > 0.f;
    HR_ARG_CHECK(!dropout, "--ranks: data parallel dumps run without dropout (each rank keys its masks by its own "
                           "rows)");
    HR_ARG_CHECK(cfg.loss_norm == LossNormalization::sum_div_window_items,
                 "--ranks: the ranks divide by the window's global real items: loss normalization "
                 "sum_div_window_items (the reference step's), not {}",
                 loss_normalization_name(cfg.loss_norm));
  }
}

std::vector<SafetensorsEntry> batch_entries(const Batch& batch) {
  std::vector<SafetensorsEntry> e;
  const std::pair<const char*, const Tensor*> named[] = {
      {"ids", &batch.ids},       {"pos", &batch.pos},      {"targets", &batch.targets},
      {"key_valid_len", &batch.key_valid_len}, {"segment_ids", &batch.segment_ids}, {"x", &batch.x}};
  for (const auto& [name, t] : named)
    if (t->defined()) e.push_back(safetensors_entry(name, *t));
  if (batch.targets_f32.defined()) e.push_back(safetensors_entry("targets", batch.targets_f32));
  return e;
}

DumpBatch make_dump_batch(Device& dev, const StepConfig& cfg, const DumpOptions& opt, uint64_t seed) {
  DumpBatch d;
  if (cfg.model == ModelKind::mlp) {
    d.batch = make_mlp_batch(dev, cfg.mlp, cfg.batch, seed);
    d.entries = batch_entries(d.batch);
    return d;
  }
  std::vector<int64_t> rows, offsets;
  std::vector<int64_t> lengths = opt.lengths;
  if (opt.layout == DumpLayout::packed) {
    if (lengths.empty()) lengths = packed_lengths(cfg.batch, cfg.seq_len, seed);
    PackPlan plan;
    d.batch = make_packed_lm_batch(dev, cfg.transformer, cfg.batch, cfg.seq_len, lengths, seed, {}, &plan);
    rows.assign(lengths.size(), 0);
    offsets.assign(lengths.size(), 0);
    for (const PackedSequence& s : plan.placed) {
      rows[static_cast<size_t>(s.index)] = s.row;
      offsets[static_cast<size_t>(s.index)] = s.offset;
    }
  } else {
    if (lengths.empty()) lengths = sample_lengths(LengthDistribution{}.scaled(cfg.seq_len), cfg.batch, seed);
    d.batch = make_lm_batch(dev, cfg.transformer, cfg.batch, cfg.seq_len, seed, lengths);
    for (size_t i = 0; i < lengths.size(); ++i) {
      rows.push_back(static_cast<int64_t>(i));
      offsets.push_back(0);
    }
  }
  d.entries = batch_entries(d.batch);
  d.entries.push_back(i32_entry("sequence_length", lengths));
  d.entries.push_back(i32_entry("sequence_row", rows));
  d.entries.push_back(i32_entry("sequence_offset", offsets));
  return d;
}

std::vector<SafetensorsEntry> flat_entries(TrainStep& step, const std::vector<float>& flat) {
  std::vector<SafetensorsEntry> out;
  size_t at = 0;
  for (const Param& p : step.params().all()) {
    if (!p.trainable) continue;
    const size_t n = static_cast<size_t>(p.master.numel());
    HR_CHECK(at + n <= flat.size(), "flat_entries: {} values for more parameters", flat.size());
    out.push_back(f32_entry(p.name, std::vector<float>(flat.begin() + static_cast<std::ptrdiff_t>(at),
                                                       flat.begin() + static_cast<std::ptrdiff_t>(at + n)),
                            p.master.shape()));
    at += n;
  }
  HR_CHECK(at == flat.size(), "flat_entries: {} values for {} parameter elements", flat.size(), at);
  return out;
}

std::vector<SafetensorsEntry> weight_entries(TrainStep& step, bool with_compute) {
  std::vector<SafetensorsEntry> w;
  for (const Param& p : step.params().all()) w.push_back(safetensors_entry(p.name, p.master));
  if (with_compute)
    for (const Param& p : step.params().all())
      if (p.compute.dtype() != p.master.dtype()) w.push_back(safetensors_entry(p.name + ".compute", p.compute));
  for (const auto& [name, t] : step.model().buffers()) w.push_back(safetensors_entry(name, t));
  return w;
}

void write_dump_file(const std::string& path, const std::vector<SafetensorsEntry>& entries) {
  write_safetensors(path, entries, file_metadata());
}

DumpResult dump_model(Device& dev, const StepConfig& cfg, const std::string& out_dir, const DumpOptions& opt) {
  validate(cfg);
  validate(opt, cfg);
  HR_ARG_CHECK(!out_dir.empty(), "out_dir: an output directory is needed");
  std::error_code ec;
  std::filesystem::create_directories(out_dir, ec);
  HR_ARG_CHECK(!ec, "out_dir: cannot create '{}': {}", out_dir, ec.message());
  const std::filesystem::path dir(out_dir);

  DumpResult r;
  r.loss_scaled = cfg.loss_scaling();
  auto put = [&](const std::filesystem::path& path, const std::vector<SafetensorsEntry>& entries) {
    write_dump_file(path.string(), entries);
    r.files.push_back(path.string());
    r.tensors += static_cast<int64_t>(entries.size());
  };

  TrainStep step(dev, cfg);
  put(dir / "weights.safetensors", weight_entries(step, false));
  const KernelCalls calls_before = kernel_calls();

  std::vector<DropoutRecord> draws;
  step.dropout_stream().log = &draws;
  std::vector<StepRecord> records;
  const int64_t passes = std::max<int64_t>(opt.steps, 1);
  for (int64_t s = 1; s <= passes; ++s) {
    StepRecord rec;
    rec.step = s;
    rec.data_seed = opt.data_seed + static_cast<uint64_t>(s - 1);
    const DumpBatch db = make_dump_batch(dev, cfg, opt, rec.data_seed);
    draws.clear();
    const int64_t sparse0 = sparse_micro_batches();
    rec.divisors = step.loss_counts(db.batch);
    if (opt.steps == 0) {
      rec.result.loss_scale = cfg.loss_scaling() ? step.scaler().scale() : 1.0;
      rec.loss = step.forward_backward(db.batch);
      rec.result.found_nonfinite = step.gradients_nonfinite();
    } else {
      rec.overflow_injected = is_overflow_step(opt, s);
      step.set_micro_batch_multipliers(rec.overflow_injected
                                           ? std::vector<double>(static_cast<size_t>(cfg.accum_steps()),
                                                                 kDumpOverflowMultiplier)
                                           : std::vector<double>{});
      rec.result = step.step(db.batch);
      rec.loss = rec.result.loss;
      if (rec.overflow_injected && !rec.result.skipped)
        throw Error(fmt::format("--overflow-steps: step {}'s losses times 2^64 did not overflow fp16 at loss scale {} "
                                "(a batch without real targets, or a scale under 2^-40?)",
                                s, rec.result.loss_scale));
      r.steps_skipped += rec.result.skipped ? 1 : 0;
    }
    rec.sparse = sparse_micro_batches() - sparse0;
    rec.scale_after = cfg.loss_scaling() ? step.scaler().scale() : 1.0;
    rec.tracker_after = step.scaler().growth_tracker();
    rec.applied = step.steps_applied();
    if (s == 1) r.loss = rec.loss;

    const std::filesystem::path at = opt.steps == 0 ? dir : dir / fmt::format("step_{}", s);
    std::filesystem::create_directories(at, ec);
    HR_ARG_CHECK(!ec, "out_dir: cannot create '{}': {}", at.string(), ec.message());
    std::vector<SafetensorsEntry> grads;
    for (const auto& [name, g] : step.gradients()) {
      grads.push_back(safetensors_entry(name, g));
      // Counted from the bytes just read back (fp32 gradients), not read again.
      const SafetensorsEntry& e = grads.back();
      HR_CHECK(e.dtype == "F32", "dump: gradient {} is {}, fp32 expected", name, e.dtype);
      for (size_t b = 0; b + sizeof(float) <= e.bytes.size(); b += sizeof(float)) {
        float v;
        std::memcpy(&v, e.bytes.data() + b, sizeof v);
        ++r.gradient_values;
        if (!std::isfinite(v) && !rec.overflow_injected) ++r.nonfinite_gradients;
      }
    }
    std::vector<SafetensorsEntry> masks;
    std::map<std::string, int64_t> seen;  // draws per site so far: the micro-batch index
    for (const DropoutRecord& d : draws) {
      const float p_site = dropout_p(cfg, d.site);
      if (!(p_site > 0.f)) continue;
      const std::string site = dropout_site(cfg, d.block, d.site);
      Tensor mask = Tensor::empty(dev, d.shape, DType::u8, Consumer::workspace);
      dropout_draw_mask(d.draw, p_site, mask);
      masks.push_back(safetensors_entry(fmt::format("{}/micro_{}", site, seen[site]++), mask));
    }
    put(at / "batch.safetensors", db.entries);
    put(at / "loss.safetensors", {safetensors_scalar_f64("loss", rec.loss)});
    put(at / "gradients.safetensors", grads);
    if (!masks.empty()) put(at / "dropout_masks.safetensors", masks);
    if (opt.steps > 0) {
      put(at / "weights.safetensors", weight_entries(step, true));
      std::vector<SafetensorsEntry> state;
      for (const auto& [name, t] : step.optimizer().state()) state.push_back(safetensors_entry(name, t));
      if (cfg.optimizer.kind == OptimizerKind::adamw8bit) {
        const auto map = [](q8::MapKind k) {
          const q8::Codebook c = q8::make_codebook(k);
          return std::vector<float>(std::begin(c.value), std::end(c.value));
        };
        state.push_back(f32_entry("maps.exp_avg", map(cfg.optimizer.adamw8bit.m_map), {q8::kCodes}));
        state.push_back(f32_entry("maps.exp_avg_sq", map(cfg.optimizer.adamw8bit.v_map), {q8::kCodes}));
      }
      put(at / "optimizer_state.safetensors", state);
    }
    records.push_back(std::move(rec));
  }
  step.dropout_stream().log = nullptr;
  r.steps = opt.steps;

  // Which attention kernels the passes ran (on a GPU in 16 bits, the memory-efficient
  // form's are the run's setting's, or the scalar ones where a shape falls back):
  // numbers compared against the dump are those kernels'.
  nlohmann::ordered_json conv_json = conventions(cfg, opt, step, records);
  if (cfg.model == ModelKind::transformer) {
    nlohmann::ordered_json ran = nlohmann::ordered_json::object();
    for (const auto& [name, calls] : kernel_calls_per_run(calls_before, kernel_calls(), static_cast<double>(passes)))
      if (name.rfind("attention_", 0) == 0) ran[name] = calls;
    conv_json["attention"]["kernel_calls_per_pass"] = ran;
  }
  const std::string conv = (dir / "conventions.json").string();
  write_output(conv, conv_json.dump(2) + "\n");
  r.files.push_back(conv);
  return r;
}

}  // namespace hr
