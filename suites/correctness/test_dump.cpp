// Tensor dumps: the safetensors files `headroom dump` writes are read back by
// an independent reader (header length, JSON header, data offsets) and compared
// with the step's own tensors: initial weights, the batch, the loss and every
// gradient byte for byte; dropout masks are 0/1 with the expected keep rate;
// the conventions file states what a reimplementation needs.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

#include "harness/check.hpp"
#include "harness/data/synthetic.hpp"
#include "harness/dump/dump.hpp"
#include "harness/step/train_step.hpp"
#include "suites/common/step_support.hpp"
#include "suites/common/test_support.hpp"

namespace {

using namespace hr;

// ---- An independent safetensors reader --------------------------------------
struct ReadTensor {
  std::string dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};

std::map<std::string, ReadTensor> read_safetensors(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << path;
  std::vector<uint8_t> file((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_GE(file.size(), 8u);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | file[static_cast<size_t>(i)];  // little-endian
  EXPECT_LE(8 + n, file.size());
  EXPECT_EQ((8 + n) % 8, 0u) << "data section not 8-byte aligned";
  const auto header = nlohmann::json::parse(file.begin() + 8, file.begin() + 8 + static_cast<std::ptrdiff_t>(n));
  const size_t data = 8 + n;
  std::map<std::string, ReadTensor> out;
  uint64_t covered = 0;
  for (const auto& [name, v] : header.items()) {
    if (name == "__metadata__") continue;
    ReadTensor t;
    t.dtype = v["dtype"];
    t.shape = v["shape"].get<std::vector<int64_t>>();
    const auto off = v["data_offsets"].get<std::vector<uint64_t>>();
    EXPECT_EQ(off.size(), 2u);
    EXPECT_LE(off[0], off[1]);
    EXPECT_LE(data + off[1], file.size());
    t.bytes.assign(file.begin() + static_cast<std::ptrdiff_t>(data + off[0]),
                   file.begin() + static_cast<std::ptrdiff_t>(data + off[1]));
    size_t elem = t.dtype == "F64" ? 8 : t.dtype == "F32" || t.dtype == "I32" ? 4 : t.dtype == "U8" ? 1 : 2;
    size_t numel = 1;
    for (int64_t d : t.shape) numel *= static_cast<size_t>(d);
    EXPECT_EQ(t.bytes.size(), numel * elem) << name;
    covered += off[1] - off[0];
    out[name] = std::move(t);
  }
  EXPECT_EQ(data + covered, file.size()) << "the data section has holes or trailing bytes";
  return out;
}

// ---- An independent Philox4x32-10, written from conventions.json's words -------
uint32_t philox_word(uint64_t key, uint64_t n) {
  const uint64_t b = n / 4, step = b / 65536;
  uint32_t x = static_cast<uint32_t>(step), y = static_cast<uint32_t>(step >> 32),
           z = static_cast<uint32_t>(b % 65536), w = 0;
  uint32_t k0 = static_cast<uint32_t>(key), k1 = static_cast<uint32_t>(key >> 32);
  for (int r = 0; r < 10; ++r) {
    const uint64_t p0 = uint64_t{0xD2511F53u} * x, p1 = uint64_t{0xCD9E8D57u} * z;
    const uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
    const uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
    const uint32_t nx = hi1 ^ y ^ k0, nz = hi0 ^ w ^ k1;
    x = nx, y = lo1, z = nz, w = lo0;
    k0 += 0x9E3779B9u, k1 += 0xBB67AE85u;
  }
  const uint32_t words[4] = {x, y, z, w};
  return words[n % 4];
}

// The keep mask of `site` (4 * block + kind) for the rows of global samples
// [sample0, sample0 + samples), `per_sample` elements each, by the per_sample rule.
std::vector<uint8_t> regenerate_mask(const nlohmann::json& dropout, double p, uint64_t site, uint64_t sample0,
                                     uint64_t samples, uint64_t per_sample) {
  const uint64_t key = dropout["seed"].get<uint64_t>();  // pass 0: key = seed
  const double threshold = std::nearbyint(p * 4294967296.0);
  std::vector<uint8_t> m;
  for (uint64_t g = sample0; g < sample0 + samples; ++g)
    for (uint64_t e = 0; e < per_sample; ++e)
      m.push_back(static_cast<double>(philox_word(key, (site << 48) + (g << 32) + e)) >= threshold ? 1 : 0);
  return m;
}

std::string temp_dir(const std::string& name) {
  const auto p = std::filesystem::temp_directory_path() / ("headroom_dump_test_" + name);
  std::filesystem::remove_all(p);
  return p.string();
}

void expect_same(const ReadTensor& r, const Tensor& t, const std::string& what) {
  EXPECT_EQ(r.shape, t.shape()) << what;
  EXPECT_EQ(r.bytes, t.to_host_bytes()) << what;
}

TEST(Dump, TransformerFilesReadBackEqual) {
  HR_TEST_DEVICE(dev, BackendKind::cpu);
  StepConfig cfg = test::tiny_transformer_config();
  cfg.transformer.dropout = 0.2f;
  const std::string dir = temp_dir("transformer");
  const DumpResult res = dump_model(dev, cfg, dir, 7);
  EXPECT_EQ(res.files.size(), 6u);

  // The same step, rebuilt independently: same seed, same batch.
  TrainStep step(dev, cfg);
  const auto weights = read_safetensors(dir + "/weights.safetensors");
  ASSERT_EQ(weights.size(), step.params().size());
  for (const Param& p : step.params().all()) {
    ASSERT_TRUE(weights.count(p.name)) << p.name;
    EXPECT_EQ(weights.at(p.name).dtype, "F32");
    expect_same(weights.at(p.name), p.master, p.name);
  }
  const auto batch_file = read_safetensors(dir + "/batch.safetensors");
  const Batch batch = make_lm_batch(dev, cfg.transformer, cfg.batch, cfg.seq_len, 7,
                                    sample_lengths(LengthDistribution{}.scaled(cfg.seq_len), cfg.batch, 7));
  expect_same(batch_file.at("ids"), batch.ids, "ids");
  expect_same(batch_file.at("targets"), batch.targets, "targets");
  expect_same(batch_file.at("key_valid_len"), batch.key_valid_len, "key_valid_len");

  const double loss = step.forward_backward(batch);
  const auto loss_file = read_safetensors(dir + "/loss.safetensors");
  ASSERT_EQ(loss_file.at("loss").dtype, "F64");
  double read_loss = 0;
  std::memcpy(&read_loss, loss_file.at("loss").bytes.data(), 8);
  EXPECT_EQ(read_loss, loss);
  EXPECT_EQ(res.loss, loss);

  const auto grads = read_safetensors(dir + "/gradients.safetensors");
  ASSERT_EQ(grads.size(), step.gradients().size());
  double norm = 0;
  for (const auto& [name, g] : step.gradients()) {
    expect_same(grads.at(name), g, name);
    norm += test::squared_norm(g.to_host_f32());
  }
  EXPECT_GT(norm, 0.0);

  // One mask per site (attention probabilities, attention output, MLP output) per
  // block per micro-batch, in the shape of what it masks, 0/1.
  const auto masks = read_safetensors(dir + "/dropout_masks.safetensors");
  EXPECT_EQ(static_cast<int64_t>(masks.size()), 3 * cfg.transformer.layers * cfg.accum_steps());
  EXPECT_TRUE(masks.count("h.1.attn.resid_dropout/micro_1"));
  EXPECT_EQ(masks.at("h.0.attn.attn_dropout/micro_0").shape,
            (std::vector<int64_t>{cfg.micro_batch, cfg.transformer.heads, cfg.seq_len, cfg.seq_len}));
  const ReadTensor& m0 = masks.at("h.0.mlp.dropout/micro_0");
  EXPECT_EQ(m0.dtype, "U8");
  EXPECT_EQ(m0.shape, (std::vector<int64_t>{cfg.micro_batch * cfg.seq_len, cfg.transformer.d_model}));
  size_t kept = 0;
  for (uint8_t b : m0.bytes) {
    EXPECT_LE(b, 1);
    kept += b;
  }
  const double keep = static_cast<double>(kept) / static_cast<double>(m0.bytes.size());
  EXPECT_NEAR(keep, 0.8, 0.06);
  EXPECT_NE(masks.at("h.0.mlp.dropout/micro_0").bytes, masks.at("h.0.mlp.dropout/micro_1").bytes);

  std::ifstream cj(dir + "/conventions.json");
  const auto conv = nlohmann::json::parse(cj);
  EXPECT_EQ(conv["format"], "headroom.dump/1");
  EXPECT_DOUBLE_EQ(conv["attention"]["scale"].get<double>(), 1.0 / std::sqrt(8.0));
  EXPECT_EQ(conv["loss"]["ignore_index"], -100);
  EXPECT_DOUBLE_EQ(conv["layernorm"]["eps"].get<double>(), 1e-5f);
  EXPECT_DOUBLE_EQ(conv["dropout"]["p"].get<double>(), 0.2f);
  EXPECT_EQ(conv["init"]["seed"], cfg.init_seed);
  EXPECT_EQ(conv["init"]["per_parameter"]["wte"], "normal(0, 0.02)");
  EXPECT_TRUE(conv.contains("weight_layout"));
  EXPECT_TRUE(conv.contains("gelu"));

  // Every mask regenerates from conventions.json alone with an independent Philox:
  // micro-batch m holds samples [m * micro_batch, (m + 1) * micro_batch).
  ASSERT_EQ(conv["dropout"]["keying"], "per_sample");
  const uint64_t mb = static_cast<uint64_t>(cfg.micro_batch);
  for (int64_t block = 0; block < cfg.transformer.layers; ++block)
    for (int64_t m = 0; m < cfg.accum_steps(); ++m)
      for (const auto& [kind, name] : conv["dropout"]["site_kind"].items()) {
        const std::string site = kind.substr(0, 2) + std::to_string(block) + kind.substr(kind.find('>') + 1);
        SCOPED_TRACE(site);
        const uint64_t s = 4 * static_cast<uint64_t>(block) + name.get<uint64_t>();
        const bool probs = site.find("attn_dropout") != std::string::npos;
        const double p = probs                                        ? conv["dropout"]["p_attn_probs"].get<double>()
                         : site.find("resid") != std::string::npos ? conv["dropout"]["p_attn_out"].get<double>()
                                                                    : conv["dropout"]["p"].get<double>();
        const uint64_t per_sample = static_cast<uint64_t>(
            probs ? cfg.transformer.heads * cfg.seq_len * cfg.seq_len : cfg.seq_len * cfg.transformer.d_model);
        EXPECT_EQ(masks.at(site + "/micro_" + std::to_string(m)).bytes,
                  regenerate_mask(conv["dropout"], p, s, static_cast<uint64_t>(m) * mb, mb, per_sample));
      }
  std::filesystem::remove_all(dir);
}

// The MLP's masks too (one sample per row), from conventions.json alone.
TEST(Dump, MlpDropoutMasksRegenerateFromConventions) {
  HR_TEST_DEVICE(dev, BackendKind::cpu);
  StepConfig cfg = test::tiny_mlp_config();
  cfg.mlp.dropout = 0.3f;
  const std::string dir = temp_dir("mlp_dropout");
  dump_model(dev, cfg, dir, 5);
  const auto masks = read_safetensors(dir + "/dropout_masks.safetensors");
  std::ifstream cj(dir + "/conventions.json");
  const auto conv = nlohmann::json::parse(cj);
  EXPECT_EQ(conv["dropout"]["site_kind"]["layers.<block>.dropout"], 0);
  EXPECT_EQ(static_cast<int64_t>(masks.size()), (cfg.mlp.layers - 1) * cfg.accum_steps());
  const uint64_t mb = static_cast<uint64_t>(cfg.micro_batch);
  for (int64_t block = 0; block < cfg.mlp.layers - 1; ++block)
    for (int64_t m = 0; m < cfg.accum_steps(); ++m)
      EXPECT_EQ(masks.at("layers." + std::to_string(block) + ".dropout/micro_" + std::to_string(m)).bytes,
                regenerate_mask(conv["dropout"], conv["dropout"]["p"].get<double>(), 4 * static_cast<uint64_t>(block),
                                static_cast<uint64_t>(m) * mb, mb, static_cast<uint64_t>(cfg.mlp.width)))
          << block << " " << m;
  std::filesystem::remove_all(dir);
}

TEST(Dump, MlpWithBatchNormWritesRunningStatistics) {
  HR_TEST_DEVICE(dev, BackendKind::cpu);
  StepConfig cfg = test::tiny_mlp_config(DType::bf16, NormKind::batchnorm);
  const std::string dir = temp_dir("mlp");
  const DumpResult res = dump_model(dev, cfg, dir, 3);
  EXPECT_EQ(res.files.size(), 5u);  // no dropout masks at p = 0
  const auto weights = read_safetensors(dir + "/weights.safetensors");
  EXPECT_TRUE(weights.count("norms.0.running_mean"));
  EXPECT_TRUE(weights.count("layers.0.weight"));
  const auto batch = read_safetensors(dir + "/batch.safetensors");
  EXPECT_EQ(batch.at("x").shape, (std::vector<int64_t>{cfg.batch, cfg.mlp.in_dim}));
  EXPECT_EQ(batch.at("targets").dtype, "F32");
  std::filesystem::remove_all(dir);
}

// LoRA: the weights hold the frozen base and the adapters, the gradients only the
// adapters (the step's own), and the conventions name the scale.
TEST(Dump, LoraWritesAdaptersAndOnlyTheirGradients) {
  HR_TEST_DEVICE(dev, BackendKind::cpu);
  StepConfig cfg = test::tiny_transformer_config();
  cfg.adapters.kind = AdapterKind::lora;
  cfg.adapters.rank = 4;
  cfg.adapters.alpha = 8.f;
  const std::string dir = temp_dir("lora");
  dump_model(dev, cfg, dir, 3);
  TrainStep step(dev, cfg);
  const auto weights = read_safetensors(dir + "/weights.safetensors");
  EXPECT_EQ(weights.size(), step.params().size());
  ASSERT_TRUE(weights.count("h.1.attn.v.lora_A"));
  EXPECT_EQ(weights.at("h.1.attn.v.lora_A").shape, (std::vector<int64_t>{4, cfg.transformer.d_model}));
  const auto grads = read_safetensors(dir + "/gradients.safetensors");
  EXPECT_EQ(grads.size(), static_cast<size_t>(4 * cfg.transformer.layers));
  for (const auto& [name, t] : grads) EXPECT_NE(name.find("lora_"), std::string::npos) << name;
  EXPECT_TRUE(grads.count("h.0.attn.q.lora_B"));
  std::ifstream in(dir + "/conventions.json");
  const nlohmann::json conv = nlohmann::json::parse(in);
  EXPECT_EQ(conv.at("adapters").at("scale").get<double>(), 2.0);
  std::filesystem::remove_all(dir);
}

TEST(Dump, InvalidConfigNamesTheField) {
  HR_TEST_DEVICE(dev, BackendKind::cpu);
  StepConfig cfg = test::tiny_transformer_config();
  cfg.transformer.heads = 5;
  try {
    dump_model(dev, cfg, temp_dir("invalid"));
    ADD_FAILURE() << "accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(std::string(e.what()).rfind("transformer.heads:", 0), 0u) << e.what();
  }
}

}  // namespace
