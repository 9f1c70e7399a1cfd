// Tensor dumps for framework developers (see dump.hpp).
#include "harness/dump/dump.hpp"

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

#include "harness/check.hpp"
#include "harness/data/synthetic.hpp"
#include "harness/dump/safetensors.hpp"
#include "harness/output.hpp"
#include "harness/step/train_step.hpp"
#include "kernels/dropout/dropout.hpp"

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
    d["key"] = "seed + pass * 0x9E3779B97F4A7C15 (mod 2^64); pass = 0 for the step this dump ran";
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
        "output), each draw advancing the offset by its element count rounded up to a multiple of 4";
  }
  return d;
}

nlohmann::ordered_json conventions(const StepConfig& cfg, TrainStep& step, double loss,
                                   const std::vector<double>& counts, int64_t sparse) {
  nlohmann::ordered_json j;
  j["format"] = "headroom.dump/1";
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
        {"projections", "separate q, k, v linears [d_model, d_model]; head h uses features [h*D, (h+1)*D)"},
        {"scale", 1.0 / std::sqrt(static_cast<double>(t.head_dim()))},
        {"scale_formula", "1/sqrt(head_dim)"},
        {"mask",
         "query t may attend key s iff s <= t (causal) and s < key_valid_len[b] (padding, when given) and "
         "segment_ids[b, s] == segment_ids[b, t] (packing, when given); masked probabilities are exactly 0, a row "
         "with every key masked is all zeros"},
        {"impl", t.memory_efficient_attention ? "memory_efficient" : "naive"}};
    j["loss"] = {{"kind", "cross_entropy"},
                 {"ignore_index", t.ignore_index},
                 {"reduction", "sum over targets != ignore_index, divided by count, times multiplier"}};
  } else {
    const MlpConfig& m = cfg.mlp;
    j["architecture"] = "per block l < layers-1: x = dropout(gelu(norm(layers.l(x)))); prediction = layers.{L-1}(x)";
    j["norm"] = {{"kind", norm_kind_name(m.norm)},
                 {"eps", m.norm_eps},
                 {"batchnorm_momentum", m.bn_momentum},
                 {"batchnorm_virtual_batch", m.bn_virtual_batch},
                 {"batchnorm_running_var", "unbiased (N/(N-1)); normalisation uses the biased batch variance"}};
    j["loss"] = {{"kind", m.task == MlpTask::regression ? "mse" : "cross_entropy"},
                 {"reduction",
                  m.task == MlpTask::regression ? "sum of (pred - target)^2 over elements, divided by count, times multiplier"
                                                : "sum over rows, divided by count, times multiplier"}};
  }
  j["loss"]["count_per_micro_batch"] = counts;
  // A language-model micro-batch with fewer than kMinRealTargets real targets says
  // little about a loss or its gradients: the dump says how many it holds.
  if (cfg.model == ModelKind::transformer) {
    j["loss"]["min_real_targets_per_micro_batch"] = kMinRealTargets;
    j["loss"]["sparse_micro_batches"] = sparse;
  }
  j["loss"]["multiplier"] = cfg.loss_multiplier;
  j["loss"]["normalization"] = loss_normalization_name(cfg.loss_norm);
  j["loss"]["value"] = loss;
  j["accumulation"] = {{"batch", cfg.batch}, {"micro_batch", cfg.micro_batch}, {"accum_steps", cfg.accum_steps()},
                       {"gradients", "fp32, summed over micro-batches, unscaled"}};
  const float p = cfg.model == ModelKind::transformer ? cfg.transformer.dropout : cfg.mlp.dropout;
  const bool any = p > 0 || (cfg.model == ModelKind::transformer &&
                             (cfg.transformer.attn_out_p() > 0 || cfg.transformer.attn_probs_p() > 0));
  j["dropout"] = dropout_conventions(cfg);
  j["dropout"]["p"] = p;
  if (cfg.model == ModelKind::transformer) {
    j["dropout"]["p_attn_probs"] = cfg.transformer.attn_probs_p();
    j["dropout"]["p_attn_out"] = cfg.transformer.attn_out_p();
  }
  j["dropout"]["masks"] = any ? "dropout_masks.safetensors: <site>/micro_<m>, uint8 1 = kept, in the shape of the "
                                "tensor it masks"
                              : "none (p = 0)";
  if (cfg.adapters.kind == AdapterKind::lora) {
    j["adapters"] = {
        {"kind", "lora"},
        {"rank", cfg.adapters.rank},
        {"alpha", cfg.adapters.alpha},
        {"scale", cfg.adapters.alpha / static_cast<float>(cfg.adapters.rank)},
        {"adapted", "h.{i}.attn.q and h.{i}.attn.v: y = x W^T + b + scale (x A^T) B^T, lora_A [r, in], lora_B [out, r]"},
        {"frozen", "every base parameter: no gradient in gradients.safetensors; only the adapters train"}};
  }
  nlohmann::ordered_json per_param = nlohmann::ordered_json::object();
  for (const Param& prm : step.params().all()) per_param[prm.name] = prm.init;
  j["init"] = {{"seed", cfg.init_seed},
               {"rng", "Philox4x32-10; normal by Box-Muller over pairs of uniforms in (0, 1]; parameter k draws "
                       "from offset k * 2^40"},
               {"per_parameter", per_param}};
  j["precision"] = {{"compute", dtype_name(cfg.precision.compute)},
                    {"master_weights", cfg.precision.master_weights},
                    {"weights_file", "fp32 masters (the compute copies are these rounded to the compute dtype)"},
                    {"loss_scale", cfg.loss_scaling() ? step.scaler().scale() : 1.0}};
  return j;
}

}  // namespace

DumpResult dump_model(Device& dev, const StepConfig& cfg, const std::string& out_dir, uint64_t data_seed) {
  validate(cfg);
  HR_ARG_CHECK(!out_dir.empty(), "out_dir: an output directory is needed");
  std::error_code ec;
  std::filesystem::create_directories(out_dir, ec);
  HR_ARG_CHECK(!ec, "out_dir: cannot create '{}': {}", out_dir, ec.message());
  const std::filesystem::path dir(out_dir);

  TrainStep step(dev, cfg);
  // The initial weights, before anything runs.
  std::vector<SafetensorsEntry> weights;
  for (const Param& p : step.params().all()) weights.push_back(safetensors_entry(p.name, p.master));
  for (const auto& [name, t] : step.model().buffers()) weights.push_back(safetensors_entry(name, t));

  Batch batch;
  std::vector<SafetensorsEntry> batch_entries;
  if (cfg.model == ModelKind::transformer) {
    const std::vector<int64_t> lengths =
        sample_lengths(LengthDistribution{}.scaled(cfg.seq_len), cfg.batch, data_seed);
    batch = make_lm_batch(dev, cfg.transformer, cfg.batch, cfg.seq_len, data_seed, lengths);
    batch_entries = {safetensors_entry("ids", batch.ids), safetensors_entry("pos", batch.pos),
                     safetensors_entry("targets", batch.targets),
                     safetensors_entry("key_valid_len", batch.key_valid_len)};
  } else {
    batch = make_mlp_batch(dev, cfg.mlp, cfg.batch, data_seed);
    batch_entries.push_back(safetensors_entry("x", batch.x));
    batch_entries.push_back(cfg.mlp.task == MlpTask::regression ? safetensors_entry("targets", batch.targets_f32)
                                                                : safetensors_entry("targets", batch.targets));
  }

  std::vector<DropoutRecord> draws;
  step.dropout_stream().log = &draws;
  const int64_t sparse0 = sparse_micro_batches();
  const double loss = step.forward_backward(batch);
  const int64_t sparse = sparse_micro_batches() - sparse0;
  step.dropout_stream().log = nullptr;
  const std::vector<double> counts = step.loss_counts(batch);

  std::vector<SafetensorsEntry> grads;
  int64_t values = 0, nonfinite = 0;
  for (const auto& [name, g] : step.gradients()) {
    grads.push_back(safetensors_entry(name, g));
    // Counted from the bytes just read back (fp32 gradients), not read again.
    const SafetensorsEntry& e = grads.back();
    HR_CHECK(e.dtype == "F32", "dump: gradient {} is {}, fp32 expected", name, e.dtype);
    for (size_t at = 0; at + sizeof(float) <= e.bytes.size(); at += sizeof(float)) {
      float v;
      std::memcpy(&v, e.bytes.data() + at, sizeof v);
      ++values;
      if (!std::isfinite(v)) ++nonfinite;
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

  const std::map<std::string, std::string> meta{{"format", "pt"}, {"producer", "headroom dump"}};
  DumpResult r;
  r.loss = loss;
  r.gradient_values = values;
  r.nonfinite_gradients = nonfinite;
  r.loss_scaled = cfg.loss_scaling();
  auto put = [&](const std::string& file, const std::vector<SafetensorsEntry>& entries) {
    const std::string path = (dir / file).string();
    write_safetensors(path, entries, meta);
    r.files.push_back(path);
    r.tensors += static_cast<int64_t>(entries.size());
  };
  put("weights.safetensors", weights);
  put("batch.safetensors", batch_entries);
  put("loss.safetensors", {safetensors_scalar_f64("loss", loss)});
  put("gradients.safetensors", grads);
  if (!masks.empty()) put("dropout_masks.safetensors", masks);
  const std::string conv = (dir / "conventions.json").string();
  write_output(conv, conventions(cfg, step, loss, counts, sparse).dump(2) + "\n");
  r.files.push_back(conv);
  return r;
}

}  // namespace hr
