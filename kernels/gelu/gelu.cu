// CUDA GELU: the shared scalar math (gelu_math.hpp) through the packed map
// kernels, so fp16/bf16 move as 16-byte packs and compute in fp32.
#include "kernels/common/cuda_map.cuh"
#include "kernels/common/dtype_dispatch.hpp"
#include "kernels/gelu/gelu_cuda.hpp"
#include "kernels/gelu/gelu_math.hpp"

namespace hr::ops::cuda {
namespace {

struct GeluForwardF {
  HR_HD float operator()(float x) const { return gelu::forward(x); }
};
struct GeluBackwardF {
  HR_HD float operator()(float x, float dy) const { return gelu::backward(x, dy); }
};

}  // namespace

void gelu_forward(const Tensor& x, Tensor& y) {
  dispatch_float(y.dtype(), "gelu_forward", [&](auto tag) {
    using T = decltype(tag);
    gpu::map1(y.data_as<T>(), x.data_as<T>(), y.numel(), GeluForwardF{}, gpu::stream_of(y));
  });
}

void gelu_backward(const Tensor& x, const Tensor& dy, Tensor& dx) {
  dispatch_float(dx.dtype(), "gelu_backward", [&](auto tag) {
    using T = decltype(tag);
    gpu::map2(dx.data_as<T>(), x.data_as<T>(), dy.data_as<T>(), dx.numel(), GeluBackwardF{}, gpu::stream_of(dx));
  });
}

}  // namespace hr::ops::cuda
