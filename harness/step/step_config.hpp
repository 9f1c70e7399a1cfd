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
  // Subtle faults, wrong on purpose (docs/catalogue.md POWER): errors of 1 / (K + 1)
  // and 1 / (window items + 1), near the bounds of the checks that must see them.
  mean_div_k_plus_one,         // an off-by-one in the accumulation count (GA-2)
  sum_div_window_items_plus_one,  // the window's real-token count off by one (GA-4)
};
const char* loss_normalization_name(LossNormalization n);
LossNormalization parse_loss_normalization(const std::string& s);

// Broken overflow handling, for negative controls only:
// - skip_micro_batch: each micro-batch is checked on its own and an overflowing one
//   is dropped while the rest of the window is applied (GA-5, gross);
// - keep_last_grad: after a skipped step, zero_grad leaves the last trainable
//   tensor's gradient in place, so the skipped window leaks into the next (GA-5, subtle);
// - no_skip: the optimizer steps on non-finite gradients (MP-3, gross);
// - backoff_mid_window: the scaler is updated at the micro-batch that overflowed, so
//   the rest of the window runs at half the scale and the window's end backs off
//   again (GA-5's window-scale check, subtle).
enum class OverflowFault : uint8_t { none, skip_micro_batch, keep_last_grad, no_skip, backoff_mid_window };

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
  // Wrong on purpose (GA-5 / MP-3 negative controls, docs/catalogue.md POWER): how a
  // broken step handles a non-finite gradient. none is right.
  OverflowFault overflow_fault = OverflowFault::none;
  // Wrong on purpose (MP-4's subtle control): this parameter keeps no fp32 master.
  std::string fault_no_master;
  // Wrong on purpose (MP-5's gross control): the model runs, and keeps its
  // activations, in fp32 although `compute` is 16-bit (autocast never applied).
  bool fault_fp32_activations = false;
  // Wrong on purpose (MP-2's controls): the step computes in fp16 although `compute`
  // says bf16 (the wrong 16-bit type picked), its loss scale whatever the scaler holds.
  bool fault_compute_fp16 = false;
};

enum class AdapterKind : uint8_t { none, lora };
struct AdapterConfig {
  AdapterKind kind = AdapterKind::none;
  int64_t rank = 8;
  float alpha = 16.f;
  // B drawn from normal(0, b_init_std) (its own Philox offset range, as every
  // parameter) instead of zero: not LoRA's init, but a starting point whose A
  // gradients and alpha / r scale a dump can show (B = 0 makes A's gradient 0).
  // 0, LoRA's zero B, in every property.
  float b_init_std = 0.f;
  // Wrong on purpose (LR-4's frozen-base controls): this base parameter ("*": every
  // one) is left trainable under the adapters.
  std::string fault_not_frozen;
  // Wrong on purpose (LR-1's controls): B drawn from normal(0, this) instead of zero.
  float fault_b_init_std = 0.f;
  // Wrong on purpose (LR-2's controls, read by merge_lora): the merge scales B A by
  // alpha instead of alpha / r (gross), or by (alpha / r)(1 + this) (subtle); off: false, 0.
  bool fault_merge_scale_alpha = false;
  double fault_merge_scale_offset = 0;
  // Wrong on purpose (LR-4's subtle control): this frozen base parameter still owns a
  // gradient buffer (no optimizer state).
  std::string fault_grad_kept;
};

// How data parallelism shards the step's state over its ranks (ZeRO's stages;
// harness/dist/sharded_step.hpp): none (every rank holds everything), zero1
// (optimizer state), zero2 (and gradients), zero3 (and parameters, gathered per
// block for its forward and its backward). A single-process TrainStep runs none only.
enum class Sharding : uint8_t { none, zero1, zero2, zero3 };
const char* sharding_name(Sharding s);  // "none" | "zero1" | "zero2" | "zero3"
Sharding parse_sharding(const std::string& s);

struct StepConfig {
  ModelKind model = ModelKind::transformer;
  MlpConfig mlp;
  TransformerConfig transformer;
  int64_t batch = 8;        // rows (samples / sequences) per optimizer step
  int64_t micro_batch = 8;  // rows per forward + backward; must divide batch
  int64_t seq_len = 64;     // transformer: tokens per row (<= max_positions)
  PrecisionConfig precision;
  LossNormalization loss_norm = LossNormalization::mean_div_k;
  // Wrong on purpose (PK-1's subtle control): the normaliser counts this many tokens
  // without a target among the window's real items (sum_div_window_items) or each
  // micro-batch's (mean_div_k). 0 in a correct step.
  int64_t fault_extra_loss_items = 0;
  // Wrong on purpose (DET-1's controls): a step that is not repeatable. Its dropout key
  // changes with every step built (an RNG seeded per run), or (subtle) every other step
  // built leaves one gradient element one ulp up, as a reduction summed in another
  // order does.
  bool fault_dropout_key_per_run = false;
  bool fault_nondeterministic_ulp = false;
  // Wrong on purpose (GA-5's unscale check, gross): the gradients are unscaled after
  // every micro-batch as well as once at the step.
  bool fault_unscale_every_micro_batch = false;
  // Wrong on purpose (GA-5's unscale check, subtle): the unscaled gradients are
  // stored in fp16, as a step that unscales the 16-bit gradients in place does:
  // every value rounded at 2^-11 and those under fp16's normal range (2^-14)
  // keeping only a few bits.
  bool fault_unscale_into_fp16 = false;
  // Wrong on purpose (GA-3's two-step AdamW check, subtle): the optimizer is told
  // step 1 at every step, as after a restore that forgot the step count, so from
  // the second step on AdamW's bias corrections are the first step's.
  bool fault_step_count_frozen = false;
  // Controlled gradient magnitude: the loss (and with it every gradient) is
  // multiplied by this, e.g. to push gradients below fp16's 2^-24 (MP-1).
  double loss_multiplier = 1.0;
  CheckpointPolicy checkpoint;
  OptimizerConfig optimizer;
  AdapterConfig adapters;
  Sharding sharding = Sharding::none;
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

// One line for people, e.g. "transformer d512 x2 layers, seq 256, batch 8 in micro-batches
// of 4, fp32, memory-efficient attention, every 2 blocks checkpointed, sgd".
std::string summary(const StepConfig& cfg);

// The ranges of a step's sizes, which validate() holds every configuration to:
// beyond them a step is no model headroom runs (and byte counts could pass 2^64).
inline constexpr int64_t kMaxBatchRows = int64_t{1} << 24;  // rows per step
inline constexpr int64_t kMaxAccumSteps = int64_t{1} << 16; // micro-batches per step
inline constexpr int64_t kMaxWidth = int64_t{1} << 16;      // d_model, MLP widths
inline constexpr int64_t kMaxLayers = 4096;
inline constexpr int64_t kMaxVocab = int64_t{1} << 24;
inline constexpr int64_t kMaxSeqLen = int64_t{1} << 20;     // seq_len, max_positions
inline constexpr int64_t kMaxMlpRatio = 64;

// Throws InvalidArgument naming the field and the reason, e.g.
// "micro_batch: 3 does not divide batch 8".
void validate(const StepConfig& cfg);

// The configuration with every fault switch off (harness/faults.hpp): the broken
// loss normalisations become their correct forms, a 16-bit accumulation buffer
// fp32, running-offset dropout keys per-sample ones, a missing master weight (all or
// one) kept, and every fault_* field, the overflow fault, the kept-label fault, the
// recompute's fresh dropout state and its second BatchNorm update cleared. A
// TrainStep built while the switches are disarmed runs this configuration.
StepConfig without_faults(StepConfig cfg);

// The preset sizes (harness/models/presets.hpp) as a step configuration.
StepConfig step_config_for(ModelKind model, Preset preset);

void to_json(nlohmann::json& j, const StepConfig& c);
// Reads the fields present in j over `base` (e.g. step_config_for(model, preset)),
// strictly: an unknown key, a value of the wrong type or range (64.7 for an
// integer, 1e308), a section that is not an object, another model's section or an
// accum_steps that contradicts batch / micro_batch throws InvalidArgument naming
// the JSON path ("transformer.d_model: ..."). Does not validate().
StepConfig step_config_from_json(const nlohmann::json& j, const StepConfig& base = StepConfig{});

}  // namespace hr
