// Token + position embedding on CUDA. Forward: a grid-stride gather over the
// [tokens, C] output (consecutive threads read consecutive columns of a row).
// Backward: one block per distinct id of the host-built inverse index; each thread
// owns columns and sums that id's token rows in token order, then adds (+=) once:
// deterministic, no atomics, and the same order as the CPU loop.
#include "harness/cuda_check.cuh"
#include "kernels/common/cuda_launch.cuh"
#include "kernels/common/dtype_dispatch.hpp"
#include "kernels/embedding/embedding_cuda.hpp"
#include "kernels/embedding/embedding_math.hpp"

namespace hr::ops::cuda {
namespace {

template <typename T>
__global__ void forward_kernel(const int32_t* ids, const int32_t* pos, const T* wte, const T* wpe, T* out,
                               int64_t tokens, int64_t C) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  gpu::RowColCursor at(first, stride, C);  // at.row: the token, at.col: the channel
  for (int64_t i = first; i < tokens * C; i += stride, at.advance()) {
    const int64_t tok = at.row, c = at.col;
    out[i] = from_float<T>(emb::combine(to_float(wte[static_cast<int64_t>(ids[tok]) * C + c]),
                                        to_float(wpe[static_cast<int64_t>(pos[tok]) * C + c])));
  }
}

template <typename D>
__global__ void backward_rows_kernel(const int32_t* row_ids, const int32_t* offsets, const int32_t* tokens,
                                     const D* dout, float* dw, int64_t C) {
  const int32_t k = static_cast<int32_t>(blockIdx.x);
  const int32_t j0 = offsets[k], j1 = offsets[k + 1];
  float* w = dw + static_cast<int64_t>(row_ids[k]) * C;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    float acc = 0.f;
    for (int32_t j = j0; j < j1; ++j) acc += to_float(dout[static_cast<int64_t>(tokens[j]) * C + c]);
    w[c] += acc;
  }
}

}  // namespace

void embedding_forward(const Tensor& ids, const Tensor& pos, const Tensor& wte, const Tensor& wpe, Tensor& out) {
  const int64_t tokens = ids.numel(), C = wte.dim(1);
  dispatch_float(wte.dtype(), "embedding_forward", [&](auto tag) {
    using T = decltype(tag);
    forward_kernel<T><<<gpu::grid_for(tokens * C), gpu::kThreads, 0, gpu::stream_of(out)>>>(
        ids.data_as<int32_t>(), pos.data_as<int32_t>(), wte.data_as<T>(), wpe.data_as<T>(), out.data_as<T>(), tokens,
        C);
    HR_CUDA_CHECK_LAUNCH();
  });
}

void embedding_backward_rows(const emb::InverseIndex& ix, const Tensor& dout, Tensor& dw) {
  if (ix.ids.empty()) return;
  Device& dev = dout.device();
  const int64_t U = static_cast<int64_t>(ix.ids.size());
  const Tensor row_ids = Tensor::from_host_i32(dev, ix.ids, {U}, Consumer::workspace);
  const Tensor offsets = Tensor::from_host_i32(dev, ix.offsets, {U + 1}, Consumer::workspace);
  const Tensor tokens =
      Tensor::from_host_i32(dev, ix.tokens, {static_cast<int64_t>(ix.tokens.size())}, Consumer::workspace);
  const int64_t C = dw.dim(1);
  const int threads = C >= 256 ? 256 : C >= 128 ? 128 : C >= 64 ? 64 : 32;
  dispatch_float(dout.dtype(), "embedding_backward", [&](auto tag) {
    using D = decltype(tag);
    backward_rows_kernel<D><<<static_cast<unsigned>(U), threads, 0, gpu::stream_of(dw)>>>(
        row_ids.data_as<int32_t>(), offsets.data_as<int32_t>(), tokens.data_as<int32_t>(), dout.data_as<D>(),
        dw.data_as<float>(), C);
    HR_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace hr::ops::cuda
