// Parameter storage, Philox initialisation and gradient buffers.
#include "harness/models/params.hpp"

#include <algorithm>
#include <cmath>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "harness/check.hpp"
#include "harness/faults.hpp"
#include "kernels/common/philox.hpp"
#include "kernels/elementwise/elementwise.hpp"

namespace hr {

namespace {
// Each parameter draws from its own range of 2^40 offsets of the stream.
constexpr uint64_t kParamStreamStride = uint64_t{1} << 40;
}  // namespace

namespace {

// Runs f(begin, end) over [0, n) in chunks of multiples of 4 draws, on up to 16
// threads for large tensors (a 300M-parameter model takes ~10 s on one core). Each
// value depends only on its index, so the result is the same on any thread count.
template <typename F>
void for_each_chunk(int64_t n, F&& f) {
  constexpr int64_t kGrain = int64_t{1} << 20;
  const int64_t hw = std::max<int64_t>(1, std::thread::hardware_concurrency());
  const int64_t threads = std::min<int64_t>({16, hw, (n + kGrain - 1) / kGrain});
  if (threads <= 1) {
    f(int64_t{0}, n);
    return;
  }
  const int64_t chunk = ((n + threads - 1) / threads + 3) / 4 * 4;
  std::vector<std::thread> pool;
  std::exception_ptr error;
  std::mutex error_mutex;
  for (int64_t t = 0; t < threads; ++t) {
    const int64_t b = t * chunk, e = std::min(n, b + chunk);
    if (b >= e) break;
    pool.emplace_back([&, b, e] {
      try {
        f(b, e);
      } catch (...) {
        const std::lock_guard<std::mutex> lock(error_mutex);
        if (!error) error = std::current_exception();
      }
    });
  }
  for (std::thread& th : pool) th.join();
  if (error) std::rethrow_exception(error);
}

// The four draws offset + i .. offset + i + 3 (i a multiple of 4; offset is one).
Philox4 draws_at(uint64_t seed, uint64_t offset, int64_t i) {
  return philox_block(seed, (offset + static_cast<uint64_t>(i)) >> 2);
}

}  // namespace

std::vector<float> philox_normal(uint64_t seed, uint64_t offset, int64_t n, float mean, float std) {
  HR_CHECK(offset % 4 == 0, "philox_normal: offset {} is not a multiple of 4", offset);
  std::vector<float> v(static_cast<size_t>(n));
  // Box-Muller on draws (d, d + 1): cos into v[d], sin into v[d + 1].
  const auto pair = [&](int64_t i, uint32_t a, uint32_t b) {
    const double u1 = uniform_from_u32(a), u2 = uniform_from_u32(b);
    const double r = std::sqrt(-2.0 * std::log(u1));
    const double angle = 6.283185307179586 * u2;
    v[static_cast<size_t>(i)] = static_cast<float>(mean + std * r * std::cos(angle));
    if (i + 1 < n) v[static_cast<size_t>(i + 1)] = static_cast<float>(mean + std * r * std::sin(angle));
  };
  for_each_chunk(n, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; i += 4) {
      const Philox4 r = draws_at(seed, offset, i);
      pair(i, r.x, r.y);
      if (i + 2 < e) pair(i + 2, r.z, r.w);
    }
  });
  return v;
}

std::vector<float> philox_uniform(uint64_t seed, uint64_t offset, int64_t n, float lo, float hi) {
  HR_CHECK(offset % 4 == 0, "philox_uniform: offset {} is not a multiple of 4", offset);
  std::vector<float> v(static_cast<size_t>(n));
  for_each_chunk(n, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; i += 4) {
      const Philox4 r = draws_at(seed, offset, i);
      const uint32_t x[4] = {r.x, r.y, r.z, r.w};
      for (int64_t j = 0; j < 4 && i + j < e; ++j) {
        // uniform_from_u32 is in (0, 1]; 1 - u is in [0, 1).
        const double u = 1.0 - uniform_from_u32(x[j]);
        v[static_cast<size_t>(i + j)] = static_cast<float>(lo + (hi - lo) * u);
      }
    }
  });
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
  // A frozen parameter (LoRA's base) never owns a gradient buffer, not even briefly:
  // the tracker's gradient peak would show it.
  const bool frozen = add_frozen_ && storage_.fault_not_frozen != "*" && p.name != storage_.fault_not_frozen;
  if (frozen) p.trainable = false;
  if (!frozen || p.name == storage_.fault_grad_kept)
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

Param& ParamSet::add_lora_b(std::string name, Shape shape) {
  const float fault = faults::armed(storage_.fault_lora_b_std);
  const float std = fault > 0.f ? fault : storage_.lora_b_init_std;
  if (std > 0.f) return add_normal(std::move(name), std::move(shape), std, true);
  return add_const(std::move(name), std::move(shape), 0.f, true);
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
