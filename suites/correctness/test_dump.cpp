// Tensor dumps: the safetensors files `headroom dump` writes are read back by
// an independent reader (header length, JSON header, data offsets) and compared
// with the step's own tensors: initial weights, the batch, the loss and every
// gradient byte for byte; dropout masks are 0/1 with the expected keep rate;
// the conventions file states what a reimplementation needs.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

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

  // One mask per block per micro-batch, [micro-batch tokens, d_model], 0/1.
  const auto masks = read_safetensors(dir + "/dropout_masks.safetensors");
  EXPECT_EQ(static_cast<int64_t>(masks.size()), cfg.transformer.layers * cfg.accum_steps());
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
