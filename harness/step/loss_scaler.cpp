// The dynamic loss scaler's update rule (see loss_scaler.hpp).
#include "harness/step/loss_scaler.hpp"

#include "harness/faults.hpp"

namespace hr {

DynamicLossScaler::DynamicLossScaler(const LossScalerConfig& cfg) : cfg_(cfg), scale_(cfg.init_scale) {
  if (faults::armed(cfg.fault_fixed_scale) > 0) scale_ = cfg.fault_fixed_scale;
}

void DynamicLossScaler::update(bool found_nonfinite) {
  if (!cfg_.dynamic || faults::armed(cfg_.fault_fixed_scale) > 0) return;
  if (found_nonfinite) {
    if (!faults::armed(cfg_.fault_no_backoff)) scale_ *= cfg_.backoff;
    if (!faults::armed(cfg_.fault_tracker_kept)) tracker_ = 0;
    return;
  }
  if (++tracker_ >= cfg_.growth_interval + (faults::armed(cfg_.fault_growth_off_by_one) ? 1 : 0)) {
    scale_ *= cfg_.growth;
    tracker_ = 0;
  }
}

}  // namespace hr
