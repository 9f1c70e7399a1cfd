// Tensor: a shape, a storage dtype (fp32 / fp16 / bf16, or int32 / uint8 for ids
// and masks), the Device it lives on and the consumer its bytes are charged to.
// Storage is shared between a tensor and its views (slices along dim 0,
// reshapes); bytes are counted once, when the storage is allocated, and given
// back when the last view goes. Dense row-major, always contiguous.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "harness/device.hpp"
#include "harness/dtype.hpp"
#include "harness/memory.hpp"

namespace hr {

using Shape = std::vector<int64_t>;
int64_t shape_numel(const Shape& s);
std::string shape_str(const Shape& s);  // "[2, 3, 4]"

class Storage {
 public:
  Storage(Device& dev, size_t bytes, Consumer c);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  void* data() const { return ptr_; }
  size_t bytes() const { return bytes_; }
  Device& device() const { return *dev_; }
  Consumer consumer() const { return consumer_; }

 private:
  Device* dev_;
  void* ptr_;
  size_t bytes_;
  Consumer consumer_;
};

class Tensor {
 public:
  Tensor() = default;  // an undefined tensor: defined() is false

  static Tensor empty(Device& dev, Shape shape, DType dtype, Consumer c);
  static Tensor zeros(Device& dev, Shape shape, DType dtype, Consumer c);
  // From fp32 host values, rounded to `dtype` on the way in (int32 and uint8
  // values are converted by value).
  static Tensor from_host(Device& dev, const std::vector<float>& values, Shape shape, DType dtype,
                          Consumer c);
  static Tensor from_host_i32(Device& dev, const std::vector<int32_t>& values, Shape shape, Consumer c);

  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  int64_t dim(int i) const;  // negative i counts from the end
  int ndim() const { return static_cast<int>(shape_.size()); }
  int64_t numel() const { return shape_numel(shape_); }
  DType dtype() const { return dtype_; }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }
  Device& device() const;
  Consumer consumer() const;
  bool is_cuda() const { return device().is_cuda(); }

  void* data() const;
  template <typename T>
  T* data_as() const {
    return static_cast<T*>(data());
  }

  // Rows [begin, end) of dim 0, sharing storage.
  Tensor slice(int64_t begin, int64_t end) const;
  // Same elements, another shape (one -1 is inferred), sharing storage.
  Tensor reshape(Shape shape) const;
  // A new tensor with its own storage, same contents.
  Tensor clone(Consumer c) const;
  Tensor clone() const { return clone(consumer()); }

  void zero_();
  void copy_from(const Tensor& src);  // same shape, dtype and device

  // Host copies. to_host_f32 widens any float dtype (and int32/uint8) to fp32.
  std::vector<float> to_host_f32() const;
  // A CPU tensor's values widened to fp32, read in place: what the CPU kernels use,
  // so that Device::host_syncs counts only reads of device memory that every backend
  // makes.
  std::vector<float> cpu_values_f32() const;
  std::vector<int32_t> to_host_i32() const;
  std::vector<uint8_t> to_host_bytes() const;  // raw storage bytes, for bitwise comparison
  void from_host_bytes(const void* src, size_t bytes);

  std::string str() const;  // "fp16[2, 3] on cuda (activations)"

 private:
  std::shared_ptr<Storage> storage_;
  size_t offset_bytes_ = 0;
  Shape shape_;
  DType dtype_ = DType::f32;
};

// Throws Error naming `what` when two tensors disagree in shape / dtype / device.
void check_same_shape(const Tensor& a, const Tensor& b, const char* what);
void check_same_device(const Tensor& a, const Tensor& b, const char* what);

}  // namespace hr
