// CUDA kernels of the element-wise ops. Maps go through the shared packed map
// (kernels/common/cuda_map.cuh); the bias gradient is a two-pass column sum over
// fixed row chunks (no atomics), so it is deterministic.
#include "harness/cuda_check.cuh"
#include "kernels/common/cuda_map.cuh"
#include "kernels/common/dtype_dispatch.hpp"
#include "kernels/elementwise/elementwise_cuda.hpp"
#include "kernels/elementwise/elementwise_math.hpp"

namespace hr::ops::cuda {
namespace {

using gpu::kThreads;
using gpu::Pack;

struct AddF {
  HR_HD float operator()(float a, float b) const { return ew::add(a, b); }
};
struct ScaleF {
  float alpha;
  HR_HD float operator()(float x) const { return ew::scale(alpha, x); }
};
struct AxpyF {
  float alpha;
  HR_HD float operator()(float x, float y) const { return ew::axpy(alpha, x, y); }
};
struct IdentityF {
  HR_HD float operator()(float x) const { return x; }
};

template <int N, typename T>
__global__ void fill_kernel(T* out, int64_t n, T value) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t packs = n / N;
  Pack<T, N> v;
#pragma unroll
  for (int k = 0; k < N; ++k) v.v[k] = value;
  for (int64_t p = tid; p < packs; p += stride) reinterpret_cast<Pack<T, N>*>(out)[p] = v;
  for (int64_t i = packs * N + tid; i < n; i += stride) out[i] = value;
}

// y[r, c] += bias[c]. N > 1 only when cols % N == 0, so a pack never crosses a row.
template <int N, typename TY, typename TB>
__global__ void add_bias_kernel(TY* y, const TB* bias, int64_t n, int64_t cols) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t packs = n / N;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  gpu::RowColCursor at(first * N, stride * N, cols);  // at.col: the pack's first column
  for (int64_t p = first; p < packs; p += stride, at.advance()) {
    Pack<TY, N> v = reinterpret_cast<Pack<TY, N>*>(y)[p];
    const int64_t c0 = at.col;
#pragma unroll
    for (int k = 0; k < N; ++k) v.v[k] = from_float<TY>(ew::add(to_float(v.v[k]), to_float(bias[c0 + k])));
    reinterpret_cast<Pack<TY, N>*>(y)[p] = v;
  }
}

// Pass 1 of bias_grad: block (32, 8) sums a 32-column tile over one row chunk;
// warps read 32 consecutive columns of a row (coalesced); the 8 row-phases are
// combined in shared memory in a fixed order.
constexpr int kTileCols = 32, kTileRows = 8;

template <typename TDY>
__global__ void bias_grad_partial_kernel(const TDY* dy, float* partial, int64_t rows, int64_t cols,
                                         int64_t rows_per_chunk) {
  __shared__ float s[kTileRows][kTileCols + 1];
  const int64_t col = static_cast<int64_t>(blockIdx.x) * kTileCols + threadIdx.x;
  const int64_t chunk = blockIdx.y;
  const int64_t r0 = chunk * rows_per_chunk;
  const int64_t r1 = r0 + rows_per_chunk < rows ? r0 + rows_per_chunk : rows;
  float acc = 0.f;
  if (col < cols)
    for (int64_t r = r0 + threadIdx.y; r < r1; r += kTileRows) acc += to_float(dy[r * cols + col]);
  s[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && col < cols) {
    float total = 0.f;
#pragma unroll
    for (int k = 0; k < kTileRows; ++k) total += s[k][threadIdx.x];
    partial[chunk * cols + col] = total;
  }
}

// Pass 2: each column's chunk sums in chunk order, added to dbias (+=).
template <typename TDB>
__global__ void bias_grad_final_kernel(const float* partial, TDB* dbias, int64_t chunks, int64_t cols) {
  const int64_t col = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (col >= cols) return;
  float total = 0.f;
  for (int64_t k = 0; k < chunks; ++k) total += partial[k * cols + col];
  dbias[col] = from_float<TDB>(ew::add(to_float(dbias[col]), total));
}

}  // namespace

void add(const Tensor& a, const Tensor& b, Tensor& out) {
  dispatch_float(out.dtype(), "add", [&](auto tag) {
    using T = decltype(tag);
    gpu::map2(out.data_as<T>(), a.data_as<T>(), b.data_as<T>(), out.numel(), AddF{}, gpu::stream_of(out));
  });
}

void scale(const Tensor& x, float alpha, Tensor& out) {
  dispatch_float(out.dtype(), "scale", [&](auto tag) {
    using T = decltype(tag);
    gpu::map1(out.data_as<T>(), x.data_as<T>(), out.numel(), ScaleF{alpha}, gpu::stream_of(out));
  });
}

void axpy(float alpha, const Tensor& x, Tensor& y) {
  dispatch_float2(x.dtype(), y.dtype(), "axpy", [&](auto tx, auto ty) {
    using TX = decltype(tx);
    using TY = decltype(ty);
    gpu::map2(y.data_as<TY>(), x.data_as<TX>(), y.data_as<TY>(), y.numel(), AxpyF{alpha}, gpu::stream_of(y));
  });
}

void cast(const Tensor& x, Tensor& out) {
  dispatch_float2(x.dtype(), out.dtype(), "cast", [&](auto tx, auto to) {
    using TX = decltype(tx);
    using TO = decltype(to);
    gpu::map1(out.data_as<TO>(), x.data_as<TX>(), out.numel(), IdentityF{}, gpu::stream_of(out));
  });
}

void fill(Tensor& out, float value) {
  const int64_t n = out.numel();
  if (n == 0) return;
  dispatch_float(out.dtype(), "fill", [&](auto tag) {
    using T = decltype(tag);
    constexpr int N = 16 / sizeof(T);
    T* p = out.data_as<T>();
    const cudaStream_t s = gpu::stream_of(out);
    if (gpu::aligned16(p) && n >= N) {
      fill_kernel<N><<<gpu::grid_for(n / N), kThreads, 0, s>>>(p, n, from_float<T>(value));
    } else {
      fill_kernel<1><<<gpu::grid_for(n), kThreads, 0, s>>>(p, n, from_float<T>(value));
    }
    HR_CUDA_CHECK_LAUNCH();
  });
}

void add_bias(Tensor& y, const Tensor& bias) {
  const int64_t n = y.numel(), cols = bias.numel();
  if (n == 0) return;
  dispatch_float2(y.dtype(), bias.dtype(), "add_bias", [&](auto ty, auto tb) {
    using TY = decltype(ty);
    using TB = decltype(tb);
    constexpr int N = 16 / sizeof(TY);
    TY* py = y.data_as<TY>();
    const TB* pb = bias.data_as<TB>();
    const cudaStream_t s = gpu::stream_of(y);
    if (cols % N == 0 && gpu::aligned16(py)) {
      add_bias_kernel<N><<<gpu::grid_for(n / N), kThreads, 0, s>>>(py, pb, n, cols);
    } else {
      add_bias_kernel<1><<<gpu::grid_for(n), kThreads, 0, s>>>(py, pb, n, cols);
    }
    HR_CUDA_CHECK_LAUNCH();
  });
}

void bias_grad(const Tensor& dy, Tensor& dbias) {
  const int64_t cols = dbias.numel(), rows = cols == 0 ? 0 : dy.numel() / cols;
  if (cols == 0) return;
  // The chunking depends only on the shape, so the summation order (and the
  // result, bit for bit) is the same on every run and every card.
  const int64_t chunks = std::clamp<int64_t>((rows + 63) / 64, 1, 512);
  const int64_t rows_per_chunk = rows == 0 ? 1 : (rows + chunks - 1) / chunks;
  Tensor partial = Tensor::empty(dbias.device(), {chunks, cols}, DType::f32, Consumer::workspace);
  const cudaStream_t s = gpu::stream_of(dbias);
  dispatch_float2(dy.dtype(), dbias.dtype(), "bias_grad", [&](auto tdy, auto tdb) {
    using TDY = decltype(tdy);
    using TDB = decltype(tdb);
    const dim3 grid(static_cast<unsigned>((cols + kTileCols - 1) / kTileCols), static_cast<unsigned>(chunks));
    bias_grad_partial_kernel<<<grid, dim3(kTileCols, kTileRows), 0, s>>>(dy.data_as<TDY>(), partial.data_as<float>(),
                                                                       rows, cols, rows_per_chunk);
    HR_CUDA_CHECK_LAUNCH();
    bias_grad_final_kernel<<<gpu::grid_for(cols), kThreads, 0, s>>>(partial.data_as<float>(), dbias.data_as<TDB>(),
                                                                   chunks, cols);
    HR_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace hr::ops::cuda
