// Dynamic loss scaling for fp16 (PyTorch GradScaler's policy): the loss is
// multiplied by `scale` before the backward pass; after all micro-batches of a
// step the fp32 gradients are unscaled once and checked. An inf/NaN anywhere
// (from any micro-batch) skips the whole step, leaves parameters and optimizer
// state untouched and multiplies the scale by `backoff`; after `growth_interval`
// consecutive clean steps the scale is multiplied by `growth`. Its fault switches are
// read through hr::faults::armed(), so a disarmed run has none.
#pragma once

#include <cstdint>

namespace hr {

struct LossScalerConfig {
  bool enabled = true;         // used only with fp16 compute; false: scale fixed at `init_scale`
  bool dynamic = true;         // false: a static scale
  double init_scale = 65536.0; // 2^16
  double growth = 2.0;
  double backoff = 0.5;
  int64_t growth_interval = 2000;
  // Wrong on purpose (MP-3's negative controls, docs/catalogue.md POWER); off in a
  // correct scaler. Grows after growth_interval + 1 clean steps (an off-by-one in
  // the counter: subtle); never backs off after an overflow (gross).
  bool fault_growth_off_by_one = false;
  bool fault_no_backoff = false;
  // Wrong on purpose (MP-3's subtle control of the skip): an overflow leaves the
  // growth counter where it was, so the scale grows early after one.
  bool fault_tracker_kept = false;
  // Wrong on purpose (MP-1's controls): > 0 makes the scaler hold this scale from the
  // first step on, whatever it was configured with (1: no loss scale at all; 2^2: a
  // scale too small to lift fp16's tail). 0 (off) in a correct scaler.
  double fault_fixed_scale = 0;
};

class DynamicLossScaler {
 public:
  explicit DynamicLossScaler(const LossScalerConfig& cfg = {});
  double scale() const { return scale_; }
  int64_t growth_tracker() const { return tracker_; }  // clean steps since the last change
  // Called once per step with whether the unscaled gradients held an inf/NaN.
  void update(bool found_nonfinite);
  const LossScalerConfig& config() const { return cfg_; }

 private:
  LossScalerConfig cfg_;
  double scale_;
  int64_t tracker_ = 0;
};

}  // namespace hr
