// The values of an int32 tensor (ids, positions, targets) on the host, for the
// checks and the host-side index work of the ops that take them: the caller's host
// copy when it has one (a Batch keeps the copy its data was made from), a CPU
// tensor's own memory, and only when neither exists a read from the GPU, which
// waits for the stream. A training step passes the copies, so it never waits there.
#pragma once

#include <cstdint>
#include <vector>

#include "harness/check.hpp"
#include "harness/tensor.hpp"

namespace hr::ops {

class HostInts {
 public:
  // host_copy, when given, must hold t's values (its size is checked, its values are
  // trusted: it is what t was uploaded from).
  HostInts(const Tensor& t, const std::vector<int32_t>* host_copy, const char* op)
      : size_(static_cast<size_t>(t.numel())) {
    HR_CHECK(t.dtype() == DType::i32, "{}: int32 expected, got {}", op, t.str());
    if (host_copy != nullptr) {
      HR_CHECK(host_copy->size() == size_, "{}: the host copy has {} values for {}", op, host_copy->size(), t.str());
      data_ = host_copy->data();
    } else if (!t.is_cuda()) {
      data_ = static_cast<const int32_t*>(t.data());
    } else {
      own_ = t.to_host_i32();
      data_ = own_.data();
    }
  }
  HostInts(const HostInts&) = delete;
  HostInts& operator=(const HostInts&) = delete;

  size_t size() const { return size_; }
  int32_t operator[](size_t i) const { return data_[i]; }
  const int32_t* data() const { return data_; }
  std::vector<int32_t> to_vector() const { return std::vector<int32_t>(data_, data_ + size_); }

 private:
  std::vector<int32_t> own_;
  const int32_t* data_ = nullptr;
  size_t size_;
};

}  // namespace hr::ops
