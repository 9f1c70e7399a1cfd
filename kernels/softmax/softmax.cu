// Masked row softmax on CUDA: one warp per row up to S = 512 (several rows per
// block), else one block per row. Forward: one online (max, sum) pass over 16-byte
// packed loads, then a pass that writes probabilities; the mask predicate is
// softmax_math.hpp's, shared with the CPU. Backward: a row dot product, then the
// element formula. Fixed-order reductions: the same inputs give the same bits.
#include <climits>

#include "harness/cuda_check.cuh"
#include "kernels/common/cuda_rowwise.cuh"
#include "kernels/common/dtype_dispatch.hpp"
#include "kernels/softmax/softmax_cuda.hpp"
#include "kernels/softmax/softmax_math.hpp"

namespace hr::ops::cuda {
namespace {

template <typename T>
__global__ void forward_kernel(const T* x, T* p, bool causal, const int32_t* kvl, const int32_t* seg, float scale,
                               int64_t rows, int64_t H, int64_t Tq, int64_t S, bool vec) {
  __shared__ gpu::RowScratch scratch[4];
  const int64_t row = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y;
  if (row >= rows) return;
  gpu::RowScratch& sh = scratch[threadIdx.y];
  const int64_t t = row % Tq, b = row / (H * Tq);
  const sm::RowMask m{causal, static_cast<int32_t>(t), kvl ? kvl[b] : INT32_MAX, seg ? seg + b * Tq : nullptr};
  const T* xr = x + row * S;
  float mx = -INFINITY, sum = 0.f;
  gpu::row_read(xr, S, vec, [&](int64_t s, float v) {
    if (sm::allowed(m, static_cast<int32_t>(s))) sm::online_add(mx, sum, scale * v);
  });
  gpu::row_online(mx, sum, sh);
  const float inv = mx == -INFINITY ? 0.f : 1.f / sum;  // a fully masked row is all zeros
  gpu::row_write(p + row * S, xr, xr, S, vec, [&](int64_t s, float v, float) {
    return sm::allowed(m, static_cast<int32_t>(s)) ? sm::prob(scale * v, mx, inv) : 0.f;
  });
}

template <typename T>
__global__ void backward_kernel(const T* p, const T* dp, float scale, T* ds, int64_t rows, int64_t S, bool vec) {
  __shared__ gpu::RowScratch scratch[4];
  const int64_t row = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y;
  if (row >= rows) return;
  gpu::RowScratch& sh = scratch[threadIdx.y];
  const T* pr = p + row * S;
  const T* dpr = dp + row * S;
  float dot = 0.f;
  gpu::row_read(pr, S, vec, [&](int64_t s, float pv) { dot += pv * to_float(dpr[s]); });
  dot = gpu::row_sum(dot, sh);
  gpu::row_write(ds + row * S, pr, dpr, S, vec,
                 [&](int64_t, float pv, float dpv) { return sm::dscore(pv, dpv, dot, scale); });
}

}  // namespace

void softmax_forward(const Tensor& scores, const AttnMask& mask, float scale, Tensor& probs) {
  const int64_t H = scores.dim(1), Tq = scores.dim(2), S = scores.dim(3);
  const int64_t rows = scores.numel() / S;
  const dim3 block = gpu::row_block(S);
  const int32_t* kvl = mask.key_valid_len.defined() ? mask.key_valid_len.data_as<int32_t>() : nullptr;
  const int32_t* seg = mask.segment_ids.defined() ? mask.segment_ids.data_as<int32_t>() : nullptr;
  dispatch_float(scores.dtype(), "softmax_forward", [&](auto tag) {
    using T = decltype(tag);
    const bool vec = gpu::rows_packable(scores.data_as<T>(), S) && gpu::rows_packable(probs.data_as<T>(), S);
    forward_kernel<T><<<gpu::row_grid(rows, block), block, 0, gpu::stream_of(scores)>>>(
        scores.data_as<T>(), probs.data_as<T>(), mask.causal, kvl, seg, scale, rows, H, Tq, S, vec);
    HR_CUDA_CHECK_LAUNCH();
  });
}

void softmax_backward(const Tensor& probs, const Tensor& dprobs, float scale, Tensor& dscores) {
  const int64_t S = probs.dim(-1), rows = probs.numel() / S;
  const dim3 block = gpu::row_block(S);
  dispatch_float(probs.dtype(), "softmax_backward", [&](auto tag) {
    using T = decltype(tag);
    const bool vec = gpu::rows_packable(probs.data_as<T>(), S) && gpu::rows_packable(dprobs.data_as<T>(), S) &&
                     gpu::rows_packable(dscores.data_as<T>(), S);
    backward_kernel<T><<<gpu::row_grid(rows, block), block, 0, gpu::stream_of(probs)>>>(
        probs.data_as<T>(), dprobs.data_as<T>(), scale, dscores.data_as<T>(), rows, S, vec);
    HR_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace hr::ops::cuda
