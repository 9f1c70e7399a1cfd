// One training step of a controlled model, composed from a StepConfig:
//
//   TrainStep step(device, cfg);              // validates cfg; allocates weights,
//                                             // gradients, optimizer state
//   StepResult r = step.step(batch);          // zero grads, K micro-batches of
//                                             // forward + backward, unscale once,
//                                             // overflow check, optimizer or skip
//
// The pieces, for properties that need to look in between:
//   step.forward_backward(batch)   gradients of the whole batch in fp32, real units
//                                  (unscaled), no optimizer step, no scaler update
//   step.zero_grad(); step.accumulate(batch); step.apply();   what step() does
//   step.loss(batch)               forward only, same normalisation, no gradients
//   step.grad("h.0.attn.q.weight") the accumulated fp32 gradient of a parameter
//   step.params(), step.model(), step.optimizer(), step.scaler()
//   step.segment_forward_counts()  forward executions per checkpoint segment
//   step.dropout_stream()          the dropout RNG state the next pass draws from
//                                  (harness/step/dropout_keys.hpp)
//
// Memory: parameters (fp32 masters and 16-bit compute copies) are
// Consumer::weights, fp32 gradients Consumer::gradients, optimizer moments
// Consumer::optimizer_state, what forward keeps for backward
// Consumer::activations, temporaries Consumer::workspace (batches too).
//
// Precision: fp32 | fp16 with a dynamic loss scaler (the scale multiplies every
// micro-batch's loss; gradients accumulate scaled in fp32 and are unscaled once
// per step; a non-finite value from any micro-batch skips the whole step) | bf16.
// 16-bit modes keep fp32 master weights unless precision.master_weights is false.
//
// Loss under accumulation (K = batch / micro_batch): each micro-batch's loss is a
// sum over its real items (tokens not equal to ignore_index; regression output
// elements) divided by: items(micro) * K (mean_div_k), items(window)
// (sum_div_window_items) or items(micro) (no_division, the broken variant). The
// reported loss is the sum over micro-batches, i.e. the batch loss when correct.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "harness/data/batch.hpp"
#include "harness/device.hpp"
#include "harness/models/model.hpp"
#include "harness/step/loss_scaler.hpp"
#include "harness/step/optimizer.hpp"
#include "harness/step/step_config.hpp"

namespace hr {

// A language-model micro-batch with fewer real targets than this compares little
// (below seq_len ~30 most synthetic rows hold none): every one a step sees is
// counted, and `headroom run` writes the count a property's steps saw into its
// measurements' details ("sparse_micro_batches"), so a check over such batches says so.
inline constexpr int64_t kMinRealTargets = 8;
// The micro-batches counted so far in this process, and the counting.
int64_t sparse_micro_batches();
void note_sparse_micro_batch();

struct StepResult {
  double loss = 0;             // sum of the micro-batch losses (without the loss scale)
  bool skipped = false;        // the optimizer step was skipped (non-finite gradients)
  bool found_nonfinite = false;
  double loss_scale = 1;       // the scale this step's backward passes used
  int64_t micro_batches = 0;
};

class TrainStep {
 public:
  TrainStep(Device& dev, const StepConfig& cfg);
  ~TrainStep();
  TrainStep(const TrainStep&) = delete;
  TrainStep& operator=(const TrainStep&) = delete;

  const StepConfig& config() const { return cfg_; }
  Device& device() const { return *dev_; }
  Model& model() { return *model_; }
  ParamSet& params() { return model_->params(); }
  Optimizer& optimizer() { return *optimizer_; }
  DynamicLossScaler& scaler() { return scaler_; }

  StepResult step(const Batch& batch);

  // Zero gradients, then every micro-batch's forward + backward; gradients are
  // then unscaled (real units). The loss scaler and the optimizer are not touched.
  double forward_backward(const Batch& batch);
  // Whether the last forward_backward / apply found an inf or NaN in a gradient.
  bool gradients_nonfinite() const { return nonfinite_; }

  void zero_grad();
  // Adds the gradients of every micro-batch of `batch` (scaled by the current
  // loss scale) to the fp32 gradients. The micro-batches' losses stay pending (on a
  // GPU, on their way back in stream order): apply() reads them once, so the host
  // does not wait for the device between micro-batches.
  void accumulate(const Batch& batch);
  // Unscales once, checks, updates the scaler, steps the optimizer or skips.
  StepResult apply();

  // Forward only over every micro-batch, with the step's normalisation.
  double loss(const Batch& batch);
  // The same forward pass; returns every micro-batch's logits (transformer), in order,
  // as host floats.
  std::vector<float> logits(const Batch& batch);

  const Tensor& grad(const std::string& param_name) const;
  std::vector<std::pair<std::string, Tensor>> gradients() const;  // trainable parameters, in order

  // The normaliser of each micro-batch's loss under cfg.loss_norm (see above).
  std::vector<double> loss_counts(const Batch& batch) const { return micro_counts(batch); }

  const std::vector<int64_t>& segment_forward_counts() const { return segment_counts_; }
  void reset_segment_forward_counts() { segment_counts_.clear(); }
  DropoutStream& dropout_stream() { return rng_; }
  // Called at each micro-batch's forward/backward boundary (loss computed, nothing of
  // the backward pass allocated yet) with the micro-batch's index; empty: no call.
  void set_forward_end_hook(std::function<void(int64_t micro_batch)> hook) { forward_end_hook_ = std::move(hook); }
  // Extra factors on each micro-batch's loss multiplier (index = micro-batch of the
  // window), e.g. one micro-batch whose gradients overflow fp16, or an inf / NaN
  // injected into its loss (MP-3, GA-5). Empty (the default): 1 for every one.
  void set_micro_batch_multipliers(std::vector<double> factors) { micro_multipliers_ = std::move(factors); }
  // Unscale-and-check passes run so far: one per step, each a single pass over every
  // gradient with one shared non-finite flag (one device synchronisation).
  int64_t unscale_passes() const { return unscale_passes_; }
  // The loss scale each micro-batch of the current (or last) window ran its backward at.
  const std::vector<double>& micro_batch_scales() const { return micro_scales_; }
  // Data parallelism (harness/dist/dp_step.hpp) divides once, after the all-reduce,
  // by the global count: with a divisor d > 0 every micro-batch's loss is its sum
  // over real items divided by d (1: the plain sum), whatever cfg.loss_norm says.
  // 0 (the default): cfg.loss_norm decides.
  void set_loss_divisor(double d) { loss_divisor_ = d; }
  // Hooks around every micro-batch's pass and every block's forward and backward
  // (a sharded step's gathers and reductions, harness/dist/sharded_step.hpp);
  // nullptr (the default): none. Not owned.
  void set_pass_hooks(PassHooks* hooks) { hooks_ = hooks; }
  // The window's loss (the sum of its micro-batches' losses, read back now), for a
  // step that updates the parameters itself instead of apply(): the window ends.
  double take_window_loss();
  int64_t steps_applied() const { return applied_; }
  int64_t steps_skipped() const { return skipped_; }

 private:
  void check_batch(const Batch& batch) const;
  std::vector<double> micro_counts(const Batch& batch) const;
  void unscale();
  // Forward only over every micro-batch (loss() and logits()); returns the loss.
  double forward_only(const Batch& batch, const std::function<void(const Tensor&)>& on_logits);
  void round_gradients_to(DType buffer);  // precision.grad_accum's broken variant

  Device* dev_;
  StepConfig cfg_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<Optimizer> optimizer_;
  DynamicLossScaler scaler_;
  DropoutStream rng_;
  std::vector<int64_t> segment_counts_;
  std::function<void(int64_t)> forward_end_hook_;
  // The losses of the window so far, one group per accumulate() call, in order.
  std::vector<std::vector<LossValue>> pending_losses_;
  double window_loss();  // reads and sums them (group sums, then their sum)
  double accumulated_scale_ = 1;
  int64_t micro_batches_ = 0;
  bool nonfinite_ = false;
  bool unscaled_ = false;
  int64_t applied_ = 0, skipped_ = 0;
  std::vector<double> micro_multipliers_;
  int64_t unscale_passes_ = 0;
  int64_t run_index_ = 0;  // which step built with a repeatability fault this is (DET-1)
  std::vector<double> micro_scales_;
  bool last_skipped_ = false;
  uint64_t passes_ = 0;  // accumulate() calls: the per_sample dropout key's pass
  double loss_divisor_ = 0;
  PassHooks* hooks_ = nullptr;
};

// Builds the model a configuration names (validates the configuration first).
std::unique_ptr<Model> make_model(Device& dev, const StepConfig& cfg);

}  // namespace hr
