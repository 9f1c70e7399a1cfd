// GELU (tanh form): checks, backend dispatch and the CPU loops over the shared
// scalar math in gelu_math.hpp.
#include "kernels/gelu/gelu.hpp"

#include "kernels/common/dispatch.hpp"
#include "kernels/common/dtype_dispatch.hpp"
#include "kernels/common/op_fault.hpp"
#include "kernels/gelu/gelu_math.hpp"

#if HEADROOM_HAVE_CUDA
#include "kernels/gelu/gelu_cuda.hpp"
#endif

namespace hr::ops {

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
    for (int64_t i = 0; i < n; ++i) py[i] = from_float<T>(gelu::forward(to_float(px[i])));
  });
}

void gelu_forward(const Tensor& x, Tensor& y) {
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
    for (int64_t i = 0; i < n; ++i) pdx[i] = from_float<T>(gelu::backward(to_float(px[i]), to_float(pdy[i])));
  });
}

}  // namespace hr::ops
