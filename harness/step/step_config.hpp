// The one configuration a training step is built from: which model and its size,
// the batch and how it is cut into micro-batches, the precision policy, the loss
// normalisation under accumulation, activation checkpointing, the optimizer and
// the adapter slot. validate() names the offending field in an InvalidArgument.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <string>

#include "harness/dtype.hpp"
#include "harness/models/presets.hpp"
#include "harness/step/checkpoint.hpp"
#include "harness/step/loss_scaler.hpp"
#include "harness/step/optimizer.hpp"

namespace hr {

enum class ModelKind : uint8_t { mlp, transformer };
const char* model_kind_name(ModelKind k);  // "mlp" | "transformer"
ModelKind parse_model_kind(const std::string& s);

// How a micro-batch's loss is normalised when K = batch / micro_batch
// micro-batches are accumulated into one step.
enum class LossNormalization : uint8_t {
  mean_div_k,            // mean over the micro-batch's real items, divided by K (GA-1)
  sum_div_window_items,  // sum over the micro-batch / real items of the whole window (GA-4's fix)
  no_division,           // mean over the micro-batch, not divided by K: wrong on purpose (GA-2)
  // Subtle faults, wrong on purpose (PROPERTIES.md POWER): errors of 1 / (K + 1)
  // and 1 / (window items + 1), near the bounds of the checks that must see them.
  mean_div_k_plus_one,         // an off-by-one in the accumulation count (GA-2)
  sum_div_window_items_plus_one,  // the window's real-token count off by one (GA-4)
};
const char* loss_normalization_name(LossNormalization n);
LossNormalization parse_loss_normalization(const std::string& s);

struct PrecisionConfig {
  // fp32; fp16 (dynamic loss scaling, fp32 master weights); bf16 (fp32 master
  // weights). Weights used by the ops and activations are stored in `compute`;
  // gradients always accumulate in fp32.
  DType compute = DType::f32;
  bool master_weights = true;  // false: parameters live in `compute` only (MP-4 control)
  // Where gradients accumulate across micro-batches. fp32 is right. fp16 / bf16
  // rounds the buffer to 16 bits after every micro-batch, as a framework that keeps
  // 16-bit gradient buffers does: the broken variant GA-1's subtle control runs.
  DType grad_accum = DType::f32;
  LossScalerConfig scaler;     // applies with fp16 only
};

enum class AdapterKind : uint8_t { none, lora };
struct AdapterConfig {
  AdapterKind kind = AdapterKind::none;
  int64_t rank = 8;
  float alpha = 16.f;
};

struct StepConfig {
  ModelKind model = ModelKind::transformer;
  MlpConfig mlp;
  TransformerConfig transformer;
  int64_t batch = 8;        // rows (samples / sequences) per optimizer step
  int64_t micro_batch = 8;  // rows per forward + backward; must divide batch
  int64_t seq_len = 64;     // transformer: tokens per row (<= max_positions)
  PrecisionConfig precision;
  LossNormalization loss_norm = LossNormalization::mean_div_k;
  // Controlled gradient magnitude: the loss (and with it every gradient) is
  // multiplied by this, e.g. to push gradients below fp16's 2^-24 (MP-1).
  double loss_multiplier = 1.0;
  CheckpointPolicy checkpoint;
  OptimizerConfig optimizer;
  AdapterConfig adapters;
  // Wrong on purpose: kept tensors charged to workspace (MEM-1's negative controls).
  KeptLabelFault kept_label_fault = KeptLabelFault::none;
  uint64_t init_seed = 1234;    // Philox seed of the initial parameters
  uint64_t dropout_seed = 4321; // Philox seed of the dropout masks
  // How masks are keyed (harness/step/dropout_keys.hpp): per_sample (GA-6) or the
  // running offset (GA-6's negative control).
  DropoutKeying dropout_keying = DropoutKeying::per_sample;

  int64_t accum_steps() const { return micro_batch > 0 ? batch / micro_batch : 0; }
  bool loss_scaling() const { return precision.compute == DType::f16 && precision.scaler.enabled; }
};

// Throws InvalidArgument naming the field and the reason, e.g.
// "micro_batch: 3 does not divide batch 8".
void validate(const StepConfig& cfg);

// The preset sizes (harness/models/presets.hpp) as a step configuration.
StepConfig step_config_for(ModelKind model, Preset preset);

void to_json(nlohmann::json& j, const StepConfig& c);
// Reads the fields present in j over `base` (e.g. step_config_for(model, preset));
// unknown enum names throw InvalidArgument naming the field. Does not validate.
StepConfig step_config_from_json(const nlohmann::json& j, const StepConfig& base = StepConfig{});

}  // namespace hr
