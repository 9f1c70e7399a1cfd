// Tensor storage, views and host transfers.
#include "harness/tensor.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstring>

#include "harness/check.hpp"
#include "kernels/common/float16.hpp"
#include "kernels/common/widen.hpp"

namespace hr {

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

std::string shape_str(const Shape& s) { return fmt::format("[{}]", fmt::join(s, ", ")); }

Storage::Storage(Device& dev, size_t bytes, Consumer c)
    : dev_(&dev), ptr_(dev.allocate(bytes, c)), bytes_(bytes), consumer_(c) {}

Storage::~Storage() { dev_->deallocate(ptr_, bytes_, consumer_); }

Tensor Tensor::empty(Device& dev, Shape shape, DType dtype, Consumer c) {
  for (int64_t d : shape) HR_ARG_CHECK(d >= 0, "negative dimension in shape {}", shape_str(shape));
  Tensor t;
  t.shape_ = std::move(shape);
  t.dtype_ = dtype;
  t.storage_ = std::make_shared<Storage>(dev, t.nbytes(), c);
  return t;
}

Tensor Tensor::zeros(Device& dev, Shape shape, DType dtype, Consumer c) {
  Tensor t = empty(dev, std::move(shape), dtype, c);
  t.zero_();
  return t;
}

Tensor Tensor::from_host(Device& dev, const std::vector<float>& v, Shape shape, DType dtype, Consumer c) {
  HR_CHECK(static_cast<int64_t>(v.size()) == shape_numel(shape), "{} values for shape {}", v.size(),
           shape_str(shape));
  Tensor t = empty(dev, std::move(shape), dtype, c);
  std::vector<uint8_t> buf(t.nbytes());
  const size_t n = v.size();
  switch (dtype) {
    case DType::f32: std::memcpy(buf.data(), v.data(), n * 4); break;
    case DType::f16: {
      auto* p = reinterpret_cast<uint16_t*>(buf.data());
      for (size_t i = 0; i < n; ++i) p[i] = float_to_half_bits(v[i]);
      break;
    }
    case DType::bf16: {
      auto* p = reinterpret_cast<uint16_t*>(buf.data());
      for (size_t i = 0; i < n; ++i) p[i] = float_to_bf16_bits(v[i]);
      break;
    }
    case DType::i32: {
      auto* p = reinterpret_cast<int32_t*>(buf.data());
      for (size_t i = 0; i < n; ++i) p[i] = static_cast<int32_t>(v[i]);
      break;
    }
    case DType::u8: {
      for (size_t i = 0; i < n; ++i) buf[i] = static_cast<uint8_t>(v[i]);
      break;
    }
  }
  t.from_host_bytes(buf.data(), buf.size());
  return t;
}

Tensor Tensor::from_host_i32(Device& dev, const std::vector<int32_t>& v, Shape shape, Consumer c) {
  HR_CHECK(static_cast<int64_t>(v.size()) == shape_numel(shape), "{} values for shape {}", v.size(),
           shape_str(shape));
  Tensor t = empty(dev, std::move(shape), DType::i32, c);
  t.from_host_bytes(v.data(), v.size() * sizeof(int32_t));
  return t;
}

int64_t Tensor::dim(int i) const {
  const int n = ndim();
  if (i < 0) i += n;
  HR_CHECK(i >= 0 && i < n, "dim {} of a {}-d tensor", i, n);
  return shape_[static_cast<size_t>(i)];
}

Device& Tensor::device() const {
  HR_CHECK(defined(), "undefined tensor");
  return storage_->device();
}

Consumer Tensor::consumer() const {
  HR_CHECK(defined(), "undefined tensor");
  return storage_->consumer();
}

void* Tensor::data() const {
  if (!storage_) return nullptr;
  return static_cast<char*>(storage_->data()) + offset_bytes_;
}

Tensor Tensor::slice(int64_t begin, int64_t end) const {
  HR_CHECK(ndim() >= 1, "slice of a 0-d tensor");
  HR_CHECK(0 <= begin && begin <= end && end <= shape_[0], "slice [{}, {}) of dim 0 of size {}", begin,
           end, shape_[0]);
  Tensor t = *this;
  const int64_t row = shape_numel(Shape(shape_.begin() + 1, shape_.end()));
  t.offset_bytes_ += static_cast<size_t>(begin * row) * dtype_size(dtype_);
  t.shape_[0] = end - begin;
  return t;
}

Tensor Tensor::reshape(Shape shape) const {
  int infer = -1;
  int64_t known = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      HR_CHECK(infer < 0, "more than one -1 in reshape to {}", shape_str(shape));
      infer = static_cast<int>(i);
    } else {
      known *= shape[i];
    }
  }
  if (infer >= 0) {
    HR_CHECK(known > 0 && numel() % known == 0, "cannot reshape {} to {}", shape_str(shape_), shape_str(shape));
    shape[static_cast<size_t>(infer)] = numel() / known;
  }
  HR_CHECK(shape_numel(shape) == numel(), "cannot reshape {} to {}", shape_str(shape_), shape_str(shape));
  Tensor t = *this;
  t.shape_ = std::move(shape);
  return t;
}

Tensor Tensor::clone(Consumer c) const {
  Tensor t = empty(device(), shape_, dtype_, c);
  t.copy_from(*this);
  return t;
}

void Tensor::zero_() {
  if (nbytes() > 0) device().fill_zero(data(), nbytes());
}

void Tensor::copy_from(const Tensor& src) {
  check_same_shape(*this, src, "copy_from");
  check_same_device(*this, src, "copy_from");
  HR_CHECK(dtype_ == src.dtype_, "copy_from {} into {}", src.str(), str());
  if (nbytes() > 0) device().copy_on_device(data(), src.data(), nbytes());
}

std::vector<uint8_t> Tensor::to_host_bytes() const {
  std::vector<uint8_t> out(nbytes());
  if (!out.empty()) device().copy_to_host(out.data(), data(), out.size());
  return out;
}

void Tensor::from_host_bytes(const void* src, size_t bytes) {
  HR_CHECK(bytes == nbytes(), "{} bytes into {}", bytes, str());
  if (bytes > 0) device().copy_to_device(data(), src, bytes);
}

namespace {

std::vector<float> widen_to_f32(const uint8_t* b, DType dtype, size_t n) {
  std::vector<float> out(n);
  switch (dtype) {
    case DType::f32: std::memcpy(out.data(), b, n * 4); break;
    case DType::f16: widen_floats(reinterpret_cast<const half_t*>(b), out.data(), static_cast<int64_t>(n)); break;
    case DType::bf16: widen_floats(reinterpret_cast<const bfloat16_t*>(b), out.data(), static_cast<int64_t>(n)); break;
    case DType::i32:
      for (size_t i = 0; i < n; ++i) out[i] = static_cast<float>(reinterpret_cast<const int32_t*>(b)[i]);
      break;
    case DType::u8:
      for (size_t i = 0; i < n; ++i) out[i] = b[i];
      break;
  }
  return out;
}

}  // namespace

std::vector<float> Tensor::to_host_f32() const {
  const std::vector<uint8_t> b = to_host_bytes();
  return widen_to_f32(b.data(), dtype_, static_cast<size_t>(numel()));
}

std::vector<float> Tensor::cpu_values_f32() const {
  HR_CHECK(defined() && !is_cuda(), "cpu_values_f32 of {}: a CPU tensor is needed", str());
  return widen_to_f32(static_cast<const uint8_t*>(data()), dtype_, static_cast<size_t>(numel()));
}

std::vector<int32_t> Tensor::to_host_i32() const {
  HR_CHECK(dtype_ == DType::i32, "to_host_i32 of {}", str());
  std::vector<int32_t> out(static_cast<size_t>(numel()));
  if (!out.empty()) device().copy_to_host(out.data(), data(), nbytes());
  return out;
}

std::string Tensor::str() const {
  if (!defined()) return "undefined tensor";
  return fmt::format("{}{} on {} ({})", dtype_name(dtype_), shape_str(shape_), backend_name(device().kind()),
                     consumer_name(consumer()));
}

void check_same_shape(const Tensor& a, const Tensor& b, const char* what) {
  HR_CHECK(a.shape() == b.shape(), "{}: shapes differ: {} vs {}", what, a.str(), b.str());
}

void check_same_device(const Tensor& a, const Tensor& b, const char* what) {
  HR_CHECK(&a.device() == &b.device(), "{}: tensors on different devices: {} vs {}", what, a.str(), b.str());
}

}  // namespace hr
