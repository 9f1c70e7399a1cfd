// LossValue: the deferred read of a loss (see loss_value.hpp).
#include "harness/loss_value.hpp"

#include <utility>

namespace hr {

LossValue LossValue::pending_sum_of_floats(std::shared_ptr<Device::HostReadback> items, int64_t count,
                                           double weight) {
  LossValue v;
  v.readback_ = std::move(items);
  v.form_ = Form::items;
  v.count_ = count;
  v.factor_ = weight;
  return v;
}

LossValue LossValue::pending_quotient(std::shared_ptr<Device::HostReadback> value, double divisor) {
  LossValue v;
  v.readback_ = std::move(value);
  v.form_ = Form::quotient;
  v.factor_ = divisor;
  return v;
}

double LossValue::value() const {
  if (!readback_) return value_;
  const void* bytes = readback_->wait();
  if (form_ == Form::quotient) {
    value_ = *static_cast<const double*>(bytes) / factor_;
  } else {
    const float* items = static_cast<const float*>(bytes);
    double total = 0;
    for (int64_t i = 0; i < count_; ++i) total += items[i];  // index order: deterministic
    value_ = total * factor_;
  }
  readback_.reset();
  return value_;
}

}  // namespace hr
