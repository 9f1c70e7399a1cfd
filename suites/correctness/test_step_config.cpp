// Step configuration: every invalid field is refused with an InvalidArgument
// that names it; valid presets pass; the JSON form round-trips.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <functional>

#include "harness/check.hpp"
#include "harness/step/step_config.hpp"
#include "harness/step/train_step.hpp"
#include "suites/common/step_support.hpp"
#include "suites/common/test_support.hpp"

namespace {

using namespace hr;

void expect_invalid(const StepConfig& c, const std::string& field, const std::string& reason) {
  try {
    validate(c);
    ADD_FAILURE() << "accepted; expected an error naming " << field;
  } catch (const InvalidArgument& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.rfind(field + ":", 0), 0u) << what;
    EXPECT_NE(what.find(reason), std::string::npos) << what;
  }
}

struct Case {
  const char* field;
  const char* reason;
  std::function<void(StepConfig&)> edit;
  ModelKind model = ModelKind::transformer;
};

TEST(StepConfigValidation, NamesTheFieldAndTheReason) {
  const std::vector<Case> cases = {
      {"micro_batch", "does not divide batch", [](StepConfig& c) { c.batch = 8, c.micro_batch = 3; }},
      {"micro_batch", "must be positive", [](StepConfig& c) { c.micro_batch = 0; }},
      {"batch", "must be positive", [](StepConfig& c) { c.batch = -4; }},
      {"precision.compute", "unknown compute dtype", [](StepConfig& c) { c.precision.compute = DType::i32; }},
      {"transformer.heads", "does not divide d_model", [](StepConfig& c) { c.transformer.heads = 5; }},
      {"seq_len", "longer than transformer.max_positions",
       [](StepConfig& c) { c.seq_len = c.transformer.max_positions + 1; }},
      {"seq_len", "must be positive", [](StepConfig& c) { c.seq_len = 0; }},
      {"transformer.d_model", "must be positive", [](StepConfig& c) { c.transformer.d_model = -1; }},
      {"transformer.dropout", "[0, 1)", [](StepConfig& c) { c.transformer.dropout = 1.f; }},
      {"transformer.ignore_index", "valid token id", [](StepConfig& c) { c.transformer.ignore_index = 3; }},
      {"checkpoint.every_k_blocks", ">= 0", [](StepConfig& c) { c.checkpoint.every_k_blocks = -1; }},
      {"loss_multiplier", "positive", [](StepConfig& c) { c.loss_multiplier = 0; }},
      {"precision.scaler.backoff", "(0, 1)",
       [](StepConfig& c) { c.precision.compute = DType::f16, c.precision.scaler.backoff = 1.5; }},
      {"precision.scaler.growth_interval", "positive",
       [](StepConfig& c) { c.precision.compute = DType::f16, c.precision.scaler.growth_interval = 0; }},
      {"optimizer.factory", "needs a factory", [](StepConfig& c) { c.optimizer.kind = OptimizerKind::custom; }},
      {"adapters.kind", "norm none or layernorm",
       [](StepConfig& c) { c.adapters.kind = AdapterKind::lora, c.mlp.norm = NormKind::batchnorm; }, ModelKind::mlp},
      {"adapters.rank", "must be in", [](StepConfig& c) { c.adapters.kind = AdapterKind::lora, c.adapters.rank = 0; }},
      {"adapters.alpha", "must be > 0",
       [](StepConfig& c) { c.adapters.kind = AdapterKind::lora, c.adapters.alpha = 0.f; }},
      {"mlp.layers", "at least 2", [](StepConfig& c) { c.mlp.layers = 1; }, ModelKind::mlp},
      {"mlp.width", "must be positive", [](StepConfig& c) { c.mlp.width = 0; }, ModelKind::mlp},
      {"mlp.bn_virtual_batch", "does not divide micro_batch",
       [](StepConfig& c) { c.mlp.norm = NormKind::batchnorm, c.mlp.bn_virtual_batch = 5; }, ModelKind::mlp},
      {"mlp.bn_virtual_batch", "at least 2",
       [](StepConfig& c) { c.mlp.norm = NormKind::batchnorm, c.micro_batch = 1, c.batch = 1; }, ModelKind::mlp},
      // Every size and number has a range (past it: a typo, a wrapped byte count, hours of loop).
      {"transformer.vocab", "must be in [1, 16777216]", [](StepConfig& c) { c.transformer.vocab = int64_t{1} << 62; }},
      {"batch", "must be in [1, 16777216]", [](StepConfig& c) { c.batch = int64_t{1} << 31, c.micro_batch = 1; }},
      {"micro_batch", "at most 65536 per step", [](StepConfig& c) { c.batch = 1 << 20, c.micro_batch = 1; }},
      {"transformer.layers", "must be in [1, 4096]", [](StepConfig& c) { c.transformer.layers = 5000; }},
      {"checkpoint.every_k_blocks", "at most 4096", [](StepConfig& c) { c.checkpoint.every_k_blocks = 1 << 20; }},
      {"optimizer.adamw.lr", "must be in [0, 1e+06]", [](StepConfig& c) { c.optimizer.adamw.lr = 1e30f; }},
      {"optimizer.adamw.eps", "must be in [1e-30, 1]", [](StepConfig& c) { c.optimizer.adamw.eps = 0.f; }},
      {"optimizer.sgd.momentum", "must be in [0, 0.999999]",
       [](StepConfig& c) { c.optimizer.kind = OptimizerKind::sgd, c.optimizer.sgd.momentum = 1.f; }},
      {"precision.scaler.growth", "must be in [1, 1024]",
       [](StepConfig& c) { c.precision.compute = DType::f16, c.precision.scaler.growth = 1e9; }},
      {"transformer.ln_eps", "must be in [1e-30, 1]", [](StepConfig& c) { c.transformer.ln_eps = 2.f; }},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.field + std::string(" / ") + k.reason);
    StepConfig c = k.model == ModelKind::mlp ? test::tiny_mlp_config() : test::tiny_transformer_config();
    validate(c);  // the base is valid
    k.edit(c);
    expect_invalid(c, k.field, k.reason);
  }
}

TEST(StepConfigValidation, PresetsAreValid) {
  for (ModelKind m : {ModelKind::mlp, ModelKind::transformer})
    for (Preset p : {Preset::quick, Preset::full}) EXPECT_NO_THROW(validate(step_config_for(m, p)));
}

TEST(StepConfigValidation, StepRefusesAnInvalidConfigAndAWrongBatch) {
  HR_TEST_DEVICE(dev, BackendKind::cpu);
  StepConfig c = test::tiny_transformer_config();
  c.micro_batch = 3;
  EXPECT_THROW(TrainStep(dev, c), InvalidArgument);
}

TEST(StepConfigJson, RoundTripsAndNamesUnknownValues) {
  StepConfig c = test::tiny_mlp_config(DType::bf16, NormKind::layernorm);
  c.loss_norm = LossNormalization::sum_div_window_items;
  c.checkpoint.every_k_blocks = 2;
  c.optimizer.kind = OptimizerKind::sgd;
  c.optimizer.sgd.momentum = 0.9f;
  const nlohmann::json j = c;
  const StepConfig back = step_config_from_json(j);
  EXPECT_EQ(nlohmann::json(back), j);

  nlohmann::json bad = j;
  bad["precision"]["compute"] = "fp8";
  try {
    step_config_from_json(bad);
    ADD_FAILURE() << "fp8 accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(std::string(e.what()).rfind("precision.compute:", 0), 0u) << e.what();
  }
  bad = j;
  bad["loss_norm"] = "average";
  EXPECT_THROW(step_config_from_json(bad), InvalidArgument);

  // Fields over a preset: only what is given changes.
  const StepConfig preset = step_config_for(ModelKind::transformer, Preset::quick);
  const StepConfig over = step_config_from_json({{"micro_batch", 2}, {"transformer", {{"layers", 3}}}}, preset);
  EXPECT_EQ(over.micro_batch, 2);
  EXPECT_EQ(over.transformer.layers, 3);
  EXPECT_EQ(over.transformer.d_model, preset.transformer.d_model);
  EXPECT_EQ(over.seq_len, preset.seq_len);
  EXPECT_EQ(over.model, ModelKind::transformer);
}

}  // namespace
