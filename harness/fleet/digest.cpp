// The fleet's step digest (see digest.hpp).
#include "harness/fleet/digest.hpp"

#include <openssl/evp.h>

#include <fmt/format.h>

#include <chrono>
#include <cstring>

#include "harness/check.hpp"
#include "harness/data/synthetic.hpp"
#include "harness/step/train_step.hpp"

namespace hr::fleet {

std::string sha256_hex(const void* data, size_t bytes) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  HR_CHECK(EVP_Digest(data, bytes, md, &len, EVP_sha256(), nullptr) == 1 && len == 32, "SHA-256 failed (OpenSSL)");
  std::string hex;
  hex.reserve(64);
  for (unsigned int i = 0; i < len; ++i) hex += fmt::format("{:02x}", md[i]);
  return hex;
}

std::vector<DigestConfig> digest_configs() {
  StepConfig c;
  c.model = ModelKind::transformer;
  auto& t = c.transformer;
  t.vocab = 64;
  t.max_positions = 32;
  t.d_model = 32;
  t.heads = 2;
  t.layers = 2;
  t.dropout = 0.1f;  // replayed by the recompute: checkpointing with dropout
  c.seq_len = 32;
  c.batch = 8;
  c.micro_batch = 2;  // 4 micro-batches accumulated per step
  c.checkpoint.every_k_blocks = 1;
  c.optimizer.kind = OptimizerKind::adamw;
  c.precision.compute = DType::f32;
  StepConfig half = c;
  half.precision.compute = DType::f16;  // dynamic loss scaling, fp32 masters
  return {{"fp32_accumulation_checkpointing_dropout", c, 3}, {"fp16_loss_scaling_accumulation_checkpointing", half, 3}};
}

namespace {

std::string hash_tensor(const Tensor& t) {
  const std::vector<uint8_t> bytes = t.to_host_bytes();
  return sha256_hex(bytes.data(), bytes.size());
}

}  // namespace

Digest compute_digest(Device& dev, uint64_t seed) {
  const auto t0 = std::chrono::steady_clock::now();
  Digest d;
  std::string all;
  for (const DigestConfig& dc : digest_configs()) {
    StepConfig cfg = dc.cfg;
    cfg.init_seed = seed;
    cfg.dropout_seed = seed + 1;
    TrainStep step(dev, cfg);
    ConfigDigest cd;
    cd.name = dc.name;
    for (int64_t s = 0; s < dc.steps; ++s) {
      const Batch batch = make_lm_batch(dev, cfg.transformer, cfg.batch, cfg.seq_len, seed + 100 + static_cast<uint64_t>(s));
      const StepResult r = step.step(batch);
      StepDigest sd;
      sd.tensors.push_back({"loss", sha256_hex(&r.loss, sizeof r.loss)});
      for (const auto& [name, g] : step.gradients()) sd.tensors.push_back({"grad:" + name, hash_tensor(g)});
      for (const Param& p : step.params().all()) sd.tensors.push_back({"param:" + p.name, hash_tensor(p.master)});
      for (const TensorDigest& td : sd.tensors) all += td.sha256;
      cd.steps.push_back(std::move(sd));
    }
    d.configs.push_back(std::move(cd));
  }
  dev.synchronize();
  d.sha256 = sha256_hex(all.data(), all.size());
  d.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return d;
}

std::optional<DigestDifference> first_difference(const Digest& a, const Digest& b) {
  if (a.sha256 == b.sha256) return std::nullopt;
  for (size_t c = 0; c < std::max(a.configs.size(), b.configs.size()); ++c) {
    if (c >= a.configs.size() || c >= b.configs.size() || a.configs[c].name != b.configs[c].name)
      return DigestDifference{c < a.configs.size() ? a.configs[c].name : b.configs[c].name, 0, "(configuration)"};
    const ConfigDigest &x = a.configs[c], &y = b.configs[c];
    for (size_t s = 0; s < std::max(x.steps.size(), y.steps.size()); ++s) {
      if (s >= x.steps.size() || s >= y.steps.size()) return DigestDifference{x.name, static_cast<int64_t>(s + 1), "(step)"};
      const auto &u = x.steps[s].tensors, &v = y.steps[s].tensors;
      for (size_t i = 0; i < std::max(u.size(), v.size()); ++i) {
        if (i >= u.size() || i >= v.size() || u[i].name != v[i].name)
          return DigestDifference{x.name, static_cast<int64_t>(s + 1), i < u.size() ? u[i].name : v[i].name};
        if (u[i].sha256 != v[i].sha256) return DigestDifference{x.name, static_cast<int64_t>(s + 1), u[i].name};
      }
    }
  }
  return DigestDifference{"", 0, "(the overall digest only)"};
}

void to_json(nlohmann::json& j, const Digest& d) {
  nlohmann::json configs = nlohmann::json::array();
  for (const ConfigDigest& c : d.configs) {
    nlohmann::json steps = nlohmann::json::array();
    for (const StepDigest& s : c.steps) {
      nlohmann::json tensors = nlohmann::json::array();
      for (const TensorDigest& t : s.tensors) tensors.push_back({t.name, t.sha256});
      steps.push_back(std::move(tensors));
    }
    configs.push_back({{"name", c.name}, {"steps", std::move(steps)}});
  }
  j = nlohmann::json{{"sha256", d.sha256}, {"seconds", d.seconds}, {"configs", std::move(configs)}};
}

void from_json(const nlohmann::json& j, Digest& d) {
  d = Digest{};
  d.sha256 = j.at("sha256").get<std::string>();
  d.seconds = j.value("seconds", 0.0);
  for (const auto& c : j.at("configs")) {
    ConfigDigest cd;
    cd.name = c.at("name").get<std::string>();
    for (const auto& s : c.at("steps")) {
      StepDigest sd;
      for (const auto& t : s) sd.tensors.push_back({t.at(0).get<std::string>(), t.at(1).get<std::string>()});
      cd.steps.push_back(std::move(sd));
    }
    d.configs.push_back(std::move(cd));
  }
}

nlohmann::json difference_json(const std::optional<DigestDifference>& d) {
  if (!d) return nullptr;
  return {{"config", d->config}, {"step", d->step}, {"tensor", d->tensor}};
}

}  // namespace hr::fleet
