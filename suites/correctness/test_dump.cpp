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
#include "harness/data/packing.hpp"
#include "harness/dump/dump.hpp"
#include "kernels/optim/quant8_math.hpp"
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
  EXPECT_EQ(conv["format"], "headroom.dump/2");
  EXPECT_DOUBLE_EQ(conv["attention"]["scale"].get<double>(), 1.0 / std::sqrt(8.0));
  EXPECT_EQ(conv["loss"]["ignore_index"], -100);
  EXPECT_DOUBLE_EQ(conv["layernorm"]["eps"].get<double>(), 1e-5f);
  EXPECT_DOUBLE_EQ(conv["dropout"]["p"].get<double>(), 0.2f);
  EXPECT_EQ(conv["init"]["seed"], cfg.init_seed);
  EXPECT_EQ(conv["init"]["per_parameter"]["wte"], "normal(0, 0.02)");
  EXPECT_TRUE(conv.contains("weight_layout"));
  EXPECT_TRUE(conv.contains("gelu"));
  // The attention kernels the pass ran: naive, forward and backward once per block
  // and micro-batch (the test's own step above is not counted).
  const double per_pass = static_cast<double>(cfg.transformer.layers * cfg.accum_steps());
  EXPECT_EQ(conv["attention"]["kernel_calls_per_pass"],
            (nlohmann::json{{"attention_backward:naive", per_pass}, {"attention_forward:naive", per_pass}}));

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

// An F32 entry's values.
std::vector<float> f32_values(const ReadTensor& t) {
  EXPECT_EQ(t.dtype, "F32");
  std::vector<float> v(t.bytes.size() / sizeof(float));
  if (!v.empty()) std::memcpy(v.data(), t.bytes.data(), v.size() * sizeof(float));
  return v;
}

nlohmann::json read_conventions(const std::string& dir) {
  std::ifstream in(dir + "/conventions.json");
  return nlohmann::json::parse(in);
}

// --steps: every step's files are what a step run on its own holds after the same
// batches (data seed + s - 1): the gradients it applied, its weights and its
// AdamW moments after, and conventions.json's record of t and the scale.
TEST(Dump, StepsWriteWhatEachStepHeldAfterIt) {
  HR_TEST_DEVICE(dev, BackendKind::cpu);
  StepConfig cfg = test::tiny_transformer_config(DType::bf16);
  cfg.transformer.dropout = 0.1f;
  DumpOptions opt;
  opt.data_seed = 9;
  opt.steps = 3;
  const std::string dir = temp_dir("steps");
  const DumpResult res = dump_model(dev, cfg, dir, opt);
  EXPECT_EQ(res.steps, 3);
  EXPECT_EQ(res.steps_skipped, 0);
  const nlohmann::json conv = read_conventions(dir);
  ASSERT_EQ(conv["steps"].size(), 3u);

  TrainStep step(dev, cfg);
  for (int64_t s = 1; s <= 3; ++s) {
    SCOPED_TRACE(s);
    const std::string at = dir + "/step_" + std::to_string(s);
    const DumpBatch db = make_dump_batch(dev, cfg, opt, opt.data_seed + static_cast<uint64_t>(s - 1));
    const StepResult r = step.step(db.batch);
    const auto batch = read_safetensors(at + "/batch.safetensors");
    expect_same(batch.at("ids"), db.batch.ids, "ids");
    const auto grads = read_safetensors(at + "/gradients.safetensors");
    for (const auto& [name, g] : step.gradients()) expect_same(grads.at(name), g, name);
    const auto weights = read_safetensors(at + "/weights.safetensors");
    for (const Param& p : step.params().all()) {
      expect_same(weights.at(p.name), p.master, p.name);
      ASSERT_TRUE(weights.count(p.name + ".compute")) << p.name;
      EXPECT_EQ(weights.at(p.name + ".compute").dtype, "BF16");
      expect_same(weights.at(p.name + ".compute"), p.compute, p.name + ".compute");
    }
    const auto state = read_safetensors(at + "/optimizer_state.safetensors");
    const auto mine = step.optimizer().state();
    ASSERT_EQ(state.size(), mine.size());
    for (const auto& [name, t] : mine) expect_same(state.at(name), t, name);
    const auto loss = read_safetensors(at + "/loss.safetensors");
    double read_loss = 0;
    std::memcpy(&read_loss, loss.at("loss").bytes.data(), 8);
    EXPECT_EQ(read_loss, r.loss);
    const nlohmann::json& rec = conv["steps"][static_cast<size_t>(s - 1)];
    EXPECT_EQ(rec["optimizer_t"], s);
    EXPECT_EQ(rec["data_seed"], opt.data_seed + static_cast<uint64_t>(s - 1));
    EXPECT_FALSE(rec["skipped"].get<bool>());
    EXPECT_EQ(rec["loss"].get<double>(), r.loss);
    // A new mask every step: per_sample keys take the pass (s - 1).
    EXPECT_TRUE(std::filesystem::exists(at + "/dropout_masks.safetensors"));
  }
  EXPECT_NE(read_safetensors(dir + "/step_1/dropout_masks.safetensors").at("h.0.mlp.dropout/micro_0").bytes,
            read_safetensors(dir + "/step_2/dropout_masks.safetensors").at("h.0.mlp.dropout/micro_0").bytes);
  EXPECT_FALSE(std::filesystem::exists(dir + "/gradients.safetensors"));  // per step only
  std::filesystem::remove_all(dir);
}

// fp16 with the scaler: the injected overflow at step 2 is skipped (weights and
// state bytes unchanged), the scale backs off by half and step 3 runs at it.
TEST(Dump, AnInjectedOverflowIsSkippedAndBacksTheScaleOff) {
  HR_TEST_DEVICE(dev, BackendKind::cpu);
  StepConfig cfg = test::tiny_transformer_config(DType::f16);
  DumpOptions opt;
  opt.steps = 3;
  opt.overflow_steps = {2};
  opt.lengths = {12, 10, 12, 9};  // real targets in every micro-batch
  const std::string dir = temp_dir("overflow");
  const DumpResult res = dump_model(dev, cfg, dir, opt);
  EXPECT_EQ(res.steps_skipped, 1);
  EXPECT_EQ(res.nonfinite_gradients, 0);  // the asked-for overflow is not counted
  const nlohmann::json conv = read_conventions(dir);
  const nlohmann::json& st = conv["steps"];
  EXPECT_EQ(st[0]["loss_scale"].get<double>(), cfg.precision.scaler.init_scale);
  EXPECT_TRUE(st[1]["skipped"].get<bool>());
  EXPECT_TRUE(st[1]["optimizer_t"].is_null());
  EXPECT_EQ(st[1]["loss_scale_after"].get<double>(), st[1]["loss_scale"].get<double>() / 2);
  EXPECT_EQ(st[1]["growth_tracker_after"], 0);
  EXPECT_EQ(st[2]["loss_scale"], st[1]["loss_scale_after"]);
  EXPECT_EQ(st[2]["optimizer_t"], 2);
  const auto w1 = read_safetensors(dir + "/step_1/weights.safetensors");
  const auto w2 = read_safetensors(dir + "/step_2/weights.safetensors");
  for (const auto& [name, t] : w1) EXPECT_EQ(t.bytes, w2.at(name).bytes) << name;
  const auto s1 = read_safetensors(dir + "/step_1/optimizer_state.safetensors");
  const auto s2 = read_safetensors(dir + "/step_2/optimizer_state.safetensors");
  for (const auto& [name, t] : s1) EXPECT_EQ(t.bytes, s2.at(name).bytes) << name;
  int64_t nonfinite = 0;
  for (const auto& [name, t] : read_safetensors(dir + "/step_2/gradients.safetensors"))
    for (float v : f32_values(t)) nonfinite += std::isfinite(v) ? 0 : 1;
  EXPECT_GT(nonfinite, 0);
  std::filesystem::remove_all(dir);
}

// 8-bit AdamW: codes and absmax as the optimizer holds them, and the two maps are
// the codebooks value for value.
TEST(Dump, EightBitStateHoldsCodesAbsmaxAndBothMaps) {
  HR_TEST_DEVICE(dev, BackendKind::cpu);
  StepConfig cfg = test::tiny_transformer_config();
  cfg.transformer.d_model = 64;  // 64 x 64 = 4096 elements: the 8-bit threshold
  cfg.optimizer.kind = OptimizerKind::adamw8bit;
  DumpOptions opt;
  opt.steps = 2;
  const std::string dir = temp_dir("q8");
  dump_model(dev, cfg, dir, opt);
  const auto state = read_safetensors(dir + "/step_2/optimizer_state.safetensors");
  ASSERT_TRUE(state.count("h.0.attn.q.weight.exp_avg.codes"));
  EXPECT_EQ(state.at("h.0.attn.q.weight.exp_avg.codes").dtype, "U8");
  EXPECT_EQ(state.at("h.0.attn.q.weight.exp_avg.absmax").shape, (std::vector<int64_t>{4096 / q8::kDefaultBlock}));
  EXPECT_EQ(state.at("h.0.attn.q.bias.exp_avg").dtype, "F32");  // under the threshold: fp32
  for (const auto& [name, kind] : {std::pair{"maps.exp_avg", q8::MapKind::dynamic_signed},
                                   std::pair{"maps.exp_avg_sq", q8::MapKind::dynamic_unsigned}}) {
    const ReadTensor& m = state.at(name);
    ASSERT_EQ(m.shape, (std::vector<int64_t>{256}));
    const std::vector<float> values = f32_values(m);
    for (int i = 0; i < 256; ++i)
      EXPECT_EQ(values[static_cast<size_t>(i)], static_cast<float>(q8::map_value(kind, i))) << name << " " << i;
  }
  const nlohmann::json conv = read_conventions(dir);
  EXPECT_EQ(conv["optimizer"]["block_size"], q8::kDefaultBlock);
  EXPECT_EQ(conv["optimizer"]["maps"]["exp_avg"], "dynamic_signed");
  std::filesystem::remove_all(dir);
}

// Packing: the batch holds segment ids, restarted positions and where each given
// sequence went, as first-fit decreasing places it.
TEST(Dump, PackedBatchHoldsSegmentsPositionsAndPlacement) {
  HR_TEST_DEVICE(dev, BackendKind::cpu);
  StepConfig cfg = test::tiny_transformer_config();
  DumpOptions opt;
  opt.layout = DumpLayout::packed;
  opt.lengths = {12, 7, 5, 4, 3, 3, 9, 2};
  const std::string dir = temp_dir("packed");
  dump_model(dev, cfg, dir, opt);
  const auto b = read_safetensors(dir + "/batch.safetensors");
  EXPECT_FALSE(b.count("key_valid_len"));
  const Batch want = make_packed_lm_batch(dev, cfg.transformer, cfg.batch, cfg.seq_len, opt.lengths, opt.data_seed);
  expect_same(b.at("segment_ids"), want.segment_ids, "segment_ids");
  expect_same(b.at("pos"), want.pos, "pos");
  expect_same(b.at("targets"), want.targets, "targets");
  const PackPlan plan = pack_first_fit_decreasing(opt.lengths, cfg.seq_len, cfg.batch);
  std::vector<int32_t> rows(b.at("sequence_row").bytes.size() / 4), offs(rows.size()), lens(rows.size());
  std::memcpy(rows.data(), b.at("sequence_row").bytes.data(), rows.size() * 4);
  std::memcpy(offs.data(), b.at("sequence_offset").bytes.data(), offs.size() * 4);
  std::memcpy(lens.data(), b.at("sequence_length").bytes.data(), lens.size() * 4);
  ASSERT_EQ(rows.size(), opt.lengths.size());
  std::vector<int32_t> pos(static_cast<size_t>(cfg.batch * cfg.seq_len));
  std::memcpy(pos.data(), b.at("pos").bytes.data(), pos.size() * 4);
  for (const PackedSequence& s : plan.placed) {
    const size_t i = static_cast<size_t>(s.index);
    EXPECT_EQ(rows[i], s.row);
    EXPECT_EQ(offs[i], s.offset);
    EXPECT_EQ(lens[i], opt.lengths[i]);
    for (int64_t t = 0; t < s.length; ++t)  // positions restart at each sequence
      EXPECT_EQ(pos[static_cast<size_t>(s.row * cfg.seq_len + s.offset + t)], t);
  }
  EXPECT_EQ(read_conventions(dir)["batch"]["layout"], "packed");
  std::filesystem::remove_all(dir);
}

// LoRA with B drawn (adapters.b_init_std): A's gradient is not zero, and without
// it A's gradient is exactly zero (the reason for the option).
TEST(Dump, LoraWithADrawnBHasNonZeroAGradients) {
  HR_TEST_DEVICE(dev, BackendKind::cpu);
  for (const float std : {0.f, 0.02f}) {
    StepConfig cfg = test::tiny_transformer_config();
    cfg.adapters.kind = AdapterKind::lora;
    cfg.adapters.rank = 4;
    cfg.adapters.b_init_std = std;
    const std::string dir = temp_dir("lora_b");
    DumpOptions opt;
    opt.lengths = {12, 10, 12, 9};  // real targets in every micro-batch
    dump_model(dev, cfg, dir, opt);
    const auto grads = read_safetensors(dir + "/gradients.safetensors");
    double a_norm = 0;
    for (const auto& [name, t] : grads)
      if (name.find("lora_A") != std::string::npos)
        for (float v : f32_values(t)) a_norm += static_cast<double>(v) * v;
    if (std > 0) EXPECT_GT(a_norm, 0.0);
    else EXPECT_EQ(a_norm, 0.0);
    const nlohmann::json conv = read_conventions(dir);
    EXPECT_EQ(conv["init"]["per_parameter"]["h.0.attn.q.lora_B"], std > 0 ? "normal(0, 0.02)" : "zeros");
    std::filesystem::remove_all(dir);
  }
}

// The MLP's adapters are named as its weights hold them.
TEST(Dump, MlpLoraConventionsNameTheMlpAdapters) {
  HR_TEST_DEVICE(dev, BackendKind::cpu);
  StepConfig cfg = test::tiny_mlp_config();
  cfg.adapters.kind = AdapterKind::lora;
  cfg.adapters.rank = 4;
  const std::string dir = temp_dir("mlp_lora");
  dump_model(dev, cfg, dir, 3);
  const nlohmann::json conv = read_conventions(dir);
  const std::string adapted = conv["adapters"]["adapted"];
  EXPECT_EQ(adapted.find("attn"), std::string::npos) << adapted;
  EXPECT_NE(adapted.find("layers.{i}.lora_A"), std::string::npos) << adapted;
  EXPECT_TRUE(read_safetensors(dir + "/weights.safetensors").count("layers.0.lora_A"));
  std::filesystem::remove_all(dir);
}

// A site with p = 0 draws nothing: with running_offset keys the offsets of the
// sites that do draw follow each other with no gap (the MLP-output site of a
// transformer with dropout 0 used to take its range anyway).
TEST(Dump, ASiteWithZeroPDrawsNothing) {
  HR_TEST_DEVICE(dev, BackendKind::cpu);
  StepConfig cfg = test::tiny_transformer_config();
  cfg.dropout_keying = DropoutKeying::running_offset;
  cfg.transformer.dropout = 0.f;
  cfg.transformer.attn_out_dropout = 0.1f;
  TrainStep step(dev, cfg);
  std::vector<DropoutRecord> draws;
  step.dropout_stream().log = &draws;
  const Batch b = make_lm_batch(dev, cfg.transformer, cfg.batch, cfg.seq_len, 3);
  step.forward_backward(b);
  step.dropout_stream().log = nullptr;
  ASSERT_EQ(static_cast<int64_t>(draws.size()), cfg.transformer.layers * cfg.accum_steps());
  uint64_t next = 0;
  for (const DropoutRecord& d : draws) {
    EXPECT_EQ(d.site, static_cast<int64_t>(DropoutSite::attn_out));
    EXPECT_EQ(d.draw.first, next);
    next += (static_cast<uint64_t>(shape_numel(d.shape)) + 3) / 4 * 4;
  }
  // The MLP model too: no dropout, no draw.
  StepConfig m = test::tiny_mlp_config();
  m.dropout_keying = DropoutKeying::running_offset;
  TrainStep ms(dev, m);
  draws.clear();
  ms.dropout_stream().log = &draws;
  ms.forward_backward(make_mlp_batch(dev, m.mlp, m.batch, 3));
  ms.dropout_stream().log = nullptr;
  EXPECT_TRUE(draws.empty());
}

// The options are held to the configuration, each error naming the option.
TEST(Dump, OptionsThatDoNotFitAreRefusedNamingTheOption) {
  StepConfig lm = test::tiny_transformer_config();
  StepConfig fp16 = test::tiny_transformer_config(DType::f16);
  StepConfig mlp = test::tiny_mlp_config();
  const auto refused = [](const DumpOptions& o, const StepConfig& c, const std::string& prefix) {
    try {
      validate(o, c);
      ADD_FAILURE() << "accepted; expected " << prefix;
    } catch (const InvalidArgument& e) {
      EXPECT_EQ(std::string(e.what()).rfind(prefix, 0), 0u) << e.what();
    }
  };
  DumpOptions o;
  o.steps = 2;
  o.overflow_steps = {1};
  refused(o, lm, "--overflow-steps");   // fp32: no scaler
  EXPECT_NO_THROW(validate(o, fp16));
  o.overflow_steps = {3};
  refused(o, fp16, "--overflow-steps");  // past the steps
  o = DumpOptions{};
  o.steps = kMaxDumpSteps + 1;
  refused(o, lm, "--steps");
  o = DumpOptions{};
  o.lengths = {3, 4};
  refused(o, lm, "--lengths");  // padded: one per row
  o.lengths = {3, 4, 13, 1};
  refused(o, lm, "--lengths");  // 13 > seq_len 12
  o.layout = DumpLayout::packed;
  o.lengths = std::vector<int64_t>(5, 12);
  refused(o, lm, "--lengths");  // five full rows in a batch of four
  o = DumpOptions{};
  o.layout = DumpLayout::packed;
  refused(o, mlp, "--layout");
  o = DumpOptions{};
  o.ranks = 3;
  refused(o, mlp, "--ranks");  // 32 rows over 3
  o.ranks = 2;
  StepConfig dp = mlp;
  dp.loss_norm = LossNormalization::sum_div_window_items;
  EXPECT_NO_THROW(validate(o, dp));
  dp.mlp.dropout = 0.1f;
  refused(o, dp, "--ranks");
  refused(o, mlp, "--ranks");  // mean_div_k
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
