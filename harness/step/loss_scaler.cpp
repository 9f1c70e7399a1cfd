// The dynamic loss scaler's update rule (see loss_scaler.hpp).
#include "harness/step/loss_scaler.hpp"

namespace hr {

void DynamicLossScaler::update(bool found_nonfinite) {
  if (!cfg_.dynamic || cfg_.fault_fixed_scale > 0) return;
  if (found_nonfinite) {
    if (!cfg_.fault_no_backoff) scale_ *= cfg_.backoff;
    tracker_ = 0;
    return;
  }
  if (++tracker_ >= cfg_.growth_interval + (cfg_.fault_growth_off_by_one ? 1 : 0)) {
    scale_ *= cfg_.growth;
    tracker_ = 0;
  }
}

}  // namespace hr
