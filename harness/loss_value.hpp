// A loss as the loss ops return it. On the CPU it is known at once; on a GPU the
// per-item losses (or their sum) are still on their way back to the host, and the
// value is computed the first time it is asked for. A training step keeps its
// micro-batches' losses pending and reads them once, after the last micro-batch, so
// the host never waits for the stream in between.
#pragma once

#include <cstdint>
#include <memory>

#include "harness/device.hpp"

namespace hr {

class LossValue {
 public:
  LossValue() = default;
  explicit LossValue(double value) : value_(value) {}
  // weight * (the fp32 items summed in double, in index order), as the CPU sums them.
  static LossValue pending_sum_of_floats(std::shared_ptr<Device::HostReadback> items, int64_t count, double weight);
  // One fp64 value / divisor.
  static LossValue pending_quotient(std::shared_ptr<Device::HostReadback> value, double divisor);

  // Waits for the copy the first time (one host sync if it has not landed).
  double value() const;
  operator double() const { return value(); }  // NOLINT: a loss reads as a number
  bool pending() const { return readback_ != nullptr; }

 private:
  enum class Form : uint8_t { items, quotient };
  mutable std::shared_ptr<Device::HostReadback> readback_;
  mutable double value_ = 0;
  Form form_ = Form::items;
  int64_t count_ = 0;   // Form::items: how many fp32 items (0 reads as 0)
  double factor_ = 1;   // Form::items: the sum's weight; Form::quotient: the divisor
};

}  // namespace hr
