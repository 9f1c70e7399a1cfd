// GELU (tanh form): checks, backend dispatch and the CPU loops over the shared
// scalar math in gelu_math.hpp.
#include "kernels/gelu/gelu.hpp"

#include <algorithm>
#include <array>
#include <tuple>
#include <type_traits>

#include "kernels/common/cpu_vector_math.hpp"
#include "kernels/common/dispatch.hpp"
#include "kernels/common/dtype_dispatch.hpp"
#include "kernels/common/op_fault.hpp"
#include "kernels/gelu/gelu_math.hpp"

#if HEADROOM_HAVE_CUDA
#include "kernels/gelu/gelu_cuda.hpp"
#endif

namespace hr::ops {
namespace {

// The fp32 loops on their own, so that they vectorise (cpu_vector_math.hpp): the same
// scalar math per element, through libmvec's expf.
HR_CPU_CLONES void forward_f32(const float* __restrict x, float* __restrict y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = gelu::forward(x[i]);
}

HR_CPU_CLONES void backward_f32(const float* __restrict x, const float* __restrict dy, float* __restrict dx,
                                int64_t n) {
  for (int64_t i = 0; i < n; ++i) dx[i] = gelu::backward(x[i], dy[i]);
}

// Whether two buffers of n floats overlap.
bool overlap(const void* a, const void* b, int64_t n) {
  const char *pa = static_cast<const char*>(a), *pb = static_cast<const char*>(b);
  const size_t bytes = static_cast<size_t>(n) * sizeof(float);
  return pa < pb + bytes && pb < pa + bytes;
}

// Every element through the vector loop, whatever n and wherever it lies, so that an
// element's result never depends on its position (a loop's scalar remainder would
// call the scalar expf, which rounds differently): whole vectors in place, the
// remainder (and buffers that overlap, e.g. in place) through a buffer padded to
// whole vectors.
constexpr int64_t kLanes = 8;    // AVX2's floats per vector (and twice SSE's)
constexpr int64_t kChunk = 512;  // a multiple of kLanes

// out[i] = f(in[0][i], ..., in[N-1][i]) for i < n, where loop(in..., out, count) is a
// vector loop as above.
template <size_t N, typename Loop>
void in_whole_vectors(const std::array<const float*, N>& in, float* out, int64_t n, Loop loop) {
  int64_t i = 0;
  if (std::none_of(in.begin(), in.end(), [&](const float* p) { return overlap(p, out, n); })) {
    i = n - n % kLanes;
    std::apply([&](auto... p) { loop(p..., out, i); }, in);
  }
  alignas(32) float buf[N][kChunk], res[kChunk];
  for (; i < n; i += kChunk) {
    const int64_t len = std::min(kChunk, n - i), padded = (len + kLanes - 1) / kLanes * kLanes;
    for (size_t k = 0; k < N; ++k) {
      std::copy(in[k] + i, in[k] + i + len, buf[k]);
      std::fill(buf[k] + len, buf[k] + padded, 0.f);
    }
    std::array<const float*, N> padded_in;
    for (size_t k = 0; k < N; ++k) padded_in[k] = buf[k];
    std::apply([&](auto... p) { loop(p..., res, padded); }, padded_in);
    std::copy(res, res + len, out + i);
  }
}

}  // namespace

static void gelu_forward_computed(const Tensor& x, Tensor& y) {
  HR_CHECK(x.defined() && y.defined(), "gelu_forward: undefined tensor");
  check_same_shape(x, y, "gelu_forward");
  check_same_device(x, y, "gelu_forward");
  HR_CHECK(x.dtype() == y.dtype(), "gelu_forward: dtypes differ: {} vs {}", x.str(), y.str());
  HR_IF_CUDA(y, cuda::gelu_forward(x, y));
  dispatch_float(x.dtype(), "gelu_forward", [&](auto tag) {
    using T = decltype(tag);
    const T* px = x.data_as<T>();
    T* py = y.data_as<T>();
    const int64_t n = y.numel();
    if constexpr (std::is_same_v<T, float>) return in_whole_vectors<1>({px}, py, n, forward_f32);
    for (int64_t i = 0; i < n; ++i) py[i] = from_float<T>(gelu::forward(to_float(px[i])));
  });
}

void gelu_forward(const Tensor& x, Tensor& y) {
  const OpTimer timer(x, __func__);
  gelu_forward_computed(x, y);
  apply_output_fault("gelu_forward", y);
}

void gelu_backward(const Tensor& x, const Tensor& dy, Tensor& dx) {
  HR_CHECK(x.defined() && dy.defined() && dx.defined(), "gelu_backward: undefined tensor");
  check_same_shape(x, dy, "gelu_backward");
  check_same_shape(x, dx, "gelu_backward");
  check_same_device(x, dy, "gelu_backward");
  check_same_device(x, dx, "gelu_backward");
  HR_CHECK(x.dtype() == dy.dtype() && x.dtype() == dx.dtype(), "gelu_backward: dtypes differ: {}, {}, {}",
           x.str(), dy.str(), dx.str());
  HR_IF_CUDA(dx, cuda::gelu_backward(x, dy, dx));
  dispatch_float(x.dtype(), "gelu_backward", [&](auto tag) {
    using T = decltype(tag);
    const T* px = x.data_as<T>();
    const T* pdy = dy.data_as<T>();
    T* pdx = dx.data_as<T>();
    const int64_t n = dx.numel();
    if constexpr (std::is_same_v<T, float>) return in_whole_vectors<2>({px, pdy}, pdx, n, backward_f32);
    for (int64_t i = 0; i < n; ++i) pdx[i] = from_float<T>(gelu::backward(to_float(px[i]), to_float(pdy[i])));
  });
}

}  // namespace hr::ops
