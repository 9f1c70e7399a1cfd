// Parameter storage, Philox initialisation and gradient buffers.
#include "harness/models/params.hpp"

#include <cmath>

#include "harness/check.hpp"
#include "kernels/common/philox.hpp"
#include "kernels/elementwise/elementwise.hpp"

namespace hr {

namespace {
// Each parameter draws from its own range of 2^40 offsets of the stream.
constexpr uint64_t kParamStreamStride = uint64_t{1} << 40;
}  // namespace

std::vector<float> philox_normal(uint64_t seed, uint64_t offset, int64_t n, float mean, float std) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; i += 2) {
    const uint64_t d = offset + static_cast<uint64_t>(i);
    const double u1 = uniform_from_u32(philox_draw(seed, d));
    const double u2 = uniform_from_u32(philox_draw(seed, d + 1));
    const double r = std::sqrt(-2.0 * std::log(u1));
    const double a = 6.283185307179586 * u2;
    v[static_cast<size_t>(i)] = static_cast<float>(mean + std * r * std::cos(a));
    if (i + 1 < n) v[static_cast<size_t>(i + 1)] = static_cast<float>(mean + std * r * std::sin(a));
  }
  return v;
}

std::vector<float> philox_uniform(uint64_t seed, uint64_t offset, int64_t n, float lo, float hi) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    // uniform_from_u32 is in (0, 1]; 1 - u is in [0, 1).
    const double u = 1.0 - uniform_from_u32(philox_draw(seed, offset + static_cast<uint64_t>(i)));
    v[static_cast<size_t>(i)] = static_cast<float>(lo + (hi - lo) * u);
  }
  return v;
}

Param& ParamSet::add(std::string name, Shape shape, const std::vector<float>& values, std::string init_desc,
                     bool weight_decay) {
  for (const Param& p : params_) HR_CHECK(p.name != name, "duplicate parameter name '{}'", name);
  const bool master = storage_.master_weights && name != storage_.fault_no_master;
  const DType master_dtype = master ? DType::f32 : storage_.compute;
  Param p;
  p.name = std::move(name);
  p.master = Tensor::from_host(*dev_, values, shape, master_dtype, Consumer::weights);
  if (master_dtype == storage_.compute) {
    p.compute = p.master;
  } else {
    p.compute = Tensor::empty(*dev_, shape, storage_.compute, Consumer::weights);
    ops::cast(p.master, p.compute);
  }
  p.grad = Tensor::zeros(*dev_, shape, DType::f32, Consumer::gradients);
  p.weight_decay = weight_decay;
  p.init = std::move(init_desc);
  params_.push_back(std::move(p));
  ++next_stream_;
  return params_.back();
}

Param& ParamSet::add_normal(std::string name, Shape shape, float std, bool weight_decay) {
  const auto v = philox_normal(seed_, next_stream_ * kParamStreamStride, shape_numel(shape), 0.f, std);
  return add(std::move(name), std::move(shape), v, fmt::format("normal(0, {})", std), weight_decay);
}

Param& ParamSet::add_uniform(std::string name, Shape shape, float bound, bool weight_decay) {
  const auto v = philox_uniform(seed_, next_stream_ * kParamStreamStride, shape_numel(shape), -bound, bound);
  return add(std::move(name), std::move(shape), v, fmt::format("uniform(-{0}, {0})", bound), weight_decay);
}

Param& ParamSet::add_const(std::string name, Shape shape, float value, bool weight_decay) {
  const std::vector<float> v(static_cast<size_t>(shape_numel(shape)), value);
  return add(std::move(name), std::move(shape), v, value == 0.f ? "zeros" : fmt::format("constant({})", value),
             weight_decay);
}

Param& ParamSet::at(const std::string& name) {
  for (Param& p : params_)
    if (p.name == name) return p;
  throw InvalidArgument(fmt::format("no parameter named '{}'", name));
}

const Param& ParamSet::at(const std::string& name) const { return const_cast<ParamSet*>(this)->at(name); }

int64_t ParamSet::numel() const {
  int64_t n = 0;
  for (const Param& p : params_) n += p.master.numel();
  return n;
}

int64_t ParamSet::trainable_numel() const {
  int64_t n = 0;
  for (const Param& p : params_)
    if (p.trainable) n += p.master.numel();
  return n;
}

void ParamSet::zero_grad() {
  for (Param& p : params_)
    if (p.grad.defined()) p.grad.zero_();
}

void ParamSet::sync_compute() {
  for (Param& p : params_)
    if (p.compute.data() != p.master.data()) ops::cast(p.master, p.compute);
}

void ParamSet::freeze(const std::string& name) {
  Param& p = at(name);
  p.trainable = false;
  p.grad = Tensor();
}

}  // namespace hr
