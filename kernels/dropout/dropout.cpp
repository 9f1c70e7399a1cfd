// Inverted dropout: checks, dispatch and the CPU loops. Draws are consumed a
// Philox block (4 draws) at a time, as the CUDA kernel does, so one block
// computation serves four elements.
#include "kernels/dropout/dropout.hpp"

#include <cmath>

#include "kernels/common/dispatch.hpp"
#include "kernels/common/dtype_dispatch.hpp"
#include "kernels/common/philox.hpp"
#include "kernels/dropout/dropout_math.hpp"

#if HEADROOM_HAVE_CUDA
#include "kernels/dropout/dropout_cuda.hpp"
#endif

namespace hr::ops {
namespace {

// Calls fn(i, draw) for i in [0, n) with draw = philox_draw(seed, offset + i).
template <typename Fn>
void for_each_draw(int64_t n, uint64_t seed, uint64_t offset, Fn&& fn) {
  int64_t i = 0;
  while (i < n) {
    const uint64_t d = offset + static_cast<uint64_t>(i);
    const Philox4 r = philox_block(seed, d >> 2);
    const uint32_t w[4] = {r.x, r.y, r.z, r.w};
    for (unsigned k = static_cast<unsigned>(d & 3u); k < 4 && i < n; ++k, ++i) fn(i, w[k]);
  }
}

float keep_scale(float p) { return 1.f / (1.f - p); }

void apply(const char* op, const Tensor& x, float p, uint64_t seed, uint64_t offset, Tensor& y) {
  HR_CHECK(x.defined() && y.defined(), "{}: undefined tensor", op);
  check_same_shape(x, y, op);
  check_same_device(x, y, op);
  HR_CHECK(x.dtype() == y.dtype(), "{}: dtypes differ: {} vs {}", op, x.str(), y.str());
  const uint32_t threshold = dropout_threshold(p);
  const float scale = keep_scale(p);
  HR_IF_CUDA(y, cuda::dropout_apply(x, threshold, scale, seed, offset, y));
  dispatch_float(x.dtype(), op, [&](auto tag) {
    using T = decltype(tag);
    const T* px = x.data_as<T>();
    T* py = y.data_as<T>();
    for_each_draw(y.numel(), seed, offset, [&](int64_t i, uint32_t draw) {
      py[i] = from_float<T>(dropout::apply(to_float(px[i]), dropout::keep(draw, threshold), scale));
    });
  });
}

}  // namespace

uint32_t dropout_threshold(float p) {
  HR_ARG_CHECK(p >= 0.f && p < 1.f, "dropout probability {} outside [0, 1)", p);
  const double t = std::nearbyint(static_cast<double>(p) * 4294967296.0);
  return t >= 4294967295.0 ? 0xffffffffu : static_cast<uint32_t>(t);
}

void dropout_forward(const Tensor& x, float p, uint64_t seed, uint64_t offset, Tensor& y) {
  const OpTimer timer(x, __func__);
  apply("dropout_forward", x, p, seed, offset, y);
}

void dropout_backward(const Tensor& dy, float p, uint64_t seed, uint64_t offset, Tensor& dx) {
  const OpTimer timer(dy, __func__);
  apply("dropout_backward", dy, p, seed, offset, dx);
}

void dropout_mask(int64_t numel, float p, uint64_t seed, uint64_t offset, Tensor& mask_u8) {
  HR_CHECK(mask_u8.defined() && mask_u8.dtype() == DType::u8 && mask_u8.numel() == numel,
           "dropout_mask: need a uint8 tensor of {} elements, got {}", numel, mask_u8.str());
  const uint32_t threshold = dropout_threshold(p);
  HR_IF_CUDA(mask_u8, cuda::dropout_mask(numel, threshold, seed, offset, mask_u8));
  uint8_t* m = mask_u8.data_as<uint8_t>();
  for_each_draw(numel, seed, offset, [&](int64_t i, uint32_t draw) { m[i] = dropout::keep(draw, threshold) ? 1 : 0; });
}

}  // namespace hr::ops
