// CUDA reductions. Sums are two passes of a fixed-shape tree: pass 1 runs a grid
// whose size depends only on n, each thread accumulating its grid-stride slice in
// double, then warp shuffles and a shared-memory step in a fixed order; pass 2
// reduces the per-block partials in one block the same way. No atomics, so the
// result is the same bytes on every run. The non-finite checks set a flag with a
// plain store (every writer writes 1) after a block-wide vote.
#include "harness/cuda_check.cuh"
#include "kernels/common/cuda_launch.cuh"
#include "kernels/common/dtype_dispatch.hpp"
#include "kernels/reduce/reduce_cuda.hpp"
#include "kernels/reduce/reduce_math.hpp"

namespace hr::ops::cuda {
namespace {

using gpu::kThreads;
using gpu::Pack;

constexpr int kMaxPartials = 1024;
constexpr int kWarps = kThreads / 32;

// A tracked workspace buffer for partial sums and flags, released in stream order.
class Workspace {
 public:
  Workspace(Device& dev, size_t bytes) : dev_(dev), bytes_(bytes), p_(dev.allocate(bytes, Consumer::workspace)) {}
  ~Workspace() { dev_.deallocate(p_, bytes_, Consumer::workspace); }
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;
  template <typename T>
  T* as() const {
    return static_cast<T*>(p_);
  }

 private:
  Device& dev_;
  size_t bytes_;
  void* p_;
};

// Sum of one value per thread over the block, in a fixed order; valid in thread 0.
__device__ double block_sum(double v) {
  __shared__ double warp_sums[kWarps];
#pragma unroll
  for (int d = 16; d > 0; d >>= 1) v += __shfl_down_sync(0xffffffffu, v, d);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) warp_sums[warp] = v;
  __syncthreads();
  double total = 0;
  if (threadIdx.x == 0)
    for (int w = 0; w < kWarps; ++w) total += warp_sums[w];
  return total;
}

template <int N, typename T, typename Term>
__global__ void partial_sum_kernel(const T* x, int64_t n, Term term, double* partial) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t packs = n / N;
  double acc = 0;
  for (int64_t p = tid; p < packs; p += stride) {
    const Pack<T, N> v = reinterpret_cast<const Pack<T, N>*>(x)[p];
#pragma unroll
    for (int k = 0; k < N; ++k) acc += term(to_float(v.v[k]));
  }
  for (int64_t i = packs * N + tid; i < n; i += stride) acc += term(to_float(x[i]));
  const double total = block_sum(acc);
  if (threadIdx.x == 0) partial[blockIdx.x] = total;
}

__global__ void final_sum_kernel(const double* partial, int count, double* out) {
  double acc = 0;
  for (int i = threadIdx.x; i < count; i += blockDim.x) acc += partial[i];
  const double total = block_sum(acc);
  if (threadIdx.x == 0) *out = total;
}

// Flag = 1 when any element is inf or NaN; with kUnscale also g *= inv_scale.
template <bool kUnscale, int N, typename T>
__global__ void nonfinite_kernel(T* g, int64_t n, float inv_scale, unsigned* flag) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t packs = n / N;
  bool found = false;
  for (int64_t p = tid; p < packs; p += stride) {
    Pack<T, N> v = reinterpret_cast<const Pack<T, N>*>(g)[p];
#pragma unroll
    for (int k = 0; k < N; ++k) {
      const float f = to_float(v.v[k]);
      found |= reduce::nonfinite(f);
      if (kUnscale) v.v[k] = from_float<T>(f * inv_scale);
    }
    if (kUnscale) reinterpret_cast<Pack<T, N>*>(g)[p] = v;
  }
  for (int64_t i = packs * N + tid; i < n; i += stride) {
    const float f = to_float(g[i]);
    found |= reduce::nonfinite(f);
    if (kUnscale) g[i] = from_float<T>(f * inv_scale);
  }
  if (__syncthreads_or(found) && threadIdx.x == 0) *flag = 1u;
}

// Enqueues the sum and its copy to the host; nullptr for an empty tensor.
template <typename Term>
std::shared_ptr<Device::HostReadback> device_sum(const Tensor& x, Term term, const char* op) {
  const int64_t n = x.numel();
  if (n == 0) return nullptr;
  // The grid depends only on n (never on the card), so the tree is the same everywhere.
  const int blocks = static_cast<int>(std::min<int64_t>((n + kThreads * 4 - 1) / (kThreads * 4), kMaxPartials));
  Workspace ws(x.device(), (static_cast<size_t>(blocks) + 1) * sizeof(double));
  double* partial = ws.as<double>();
  double* out = partial + blocks;
  const cudaStream_t s = gpu::stream_of(x);
  dispatch_float(x.dtype(), op, [&](auto tag) {
    using T = decltype(tag);
    constexpr int N = 16 / sizeof(T);
    const T* p = x.data_as<T>();
    if (gpu::aligned16(p)) {
      partial_sum_kernel<N><<<blocks, kThreads, 0, s>>>(p, n, term, partial);
    } else {
      partial_sum_kernel<1><<<blocks, kThreads, 0, s>>>(p, n, term, partial);
    }
    HR_CUDA_CHECK_LAUNCH();
  });
  final_sum_kernel<<<1, kThreads, 0, s>>>(partial, blocks, out);
  HR_CUDA_CHECK_LAUNCH();
  // Stream-ordered: the workspace is freed after the copy has read it.
  return x.device().read_back(out, sizeof(double));
}

double wait_for_sum(const std::shared_ptr<Device::HostReadback>& r) {
  return r ? *static_cast<const double*>(r->wait()) : 0.0;
}

// Launches the check (and unscale) of one tensor, raising *flag on an inf / NaN.
template <bool kUnscale>
void launch_nonfinite(const Tensor& g, float inv_scale, unsigned* flag, cudaStream_t s, const char* op) {
  const int64_t n = g.numel();
  if (n == 0) return;
  dispatch_float(g.dtype(), op, [&](auto tag) {
    using T = decltype(tag);
    constexpr int N = 16 / sizeof(T);
    T* p = g.data_as<T>();
    if (gpu::aligned16(p) && n >= N) {
      nonfinite_kernel<kUnscale, N><<<gpu::grid_for(n / N), kThreads, 0, s>>>(p, n, inv_scale, flag);
    } else {
      nonfinite_kernel<kUnscale, 1><<<gpu::grid_for(n), kThreads, 0, s>>>(p, n, inv_scale, flag);
    }
    HR_CUDA_CHECK_LAUNCH();
  });
}

template <bool kUnscale>
bool device_nonfinite(const Tensor& g, float inv_scale, const char* op) {
  const int64_t n = g.numel();
  if (n == 0) return false;
  Workspace ws(g.device(), sizeof(unsigned));
  unsigned* flag = ws.as<unsigned>();
  const cudaStream_t s = gpu::stream_of(g);
  HR_CUDA_CHECK(cudaMemsetAsync(flag, 0, sizeof(unsigned), s));
  dispatch_float(g.dtype(), op, [&](auto tag) {
    using T = decltype(tag);
    constexpr int N = 16 / sizeof(T);
    T* p = g.data_as<T>();
    if (gpu::aligned16(p) && n >= N) {
      nonfinite_kernel<kUnscale, N><<<gpu::grid_for(n / N), kThreads, 0, s>>>(p, n, inv_scale, flag);
    } else {
      nonfinite_kernel<kUnscale, 1><<<gpu::grid_for(n), kThreads, 0, s>>>(p, n, inv_scale, flag);
    }
    HR_CUDA_CHECK_LAUNCH();
  });
  unsigned found = 0;
  g.device().copy_to_host(&found, flag, sizeof found);
  return found != 0;
}

}  // namespace

double sum(const Tensor& x) { return wait_for_sum(device_sum(x, reduce::Identity{}, "sum")); }
LossValue sum_deferred(const Tensor& x, double divisor) {
  std::shared_ptr<Device::HostReadback> r = device_sum(x, reduce::Identity{}, "sum");
  return r ? LossValue::pending_quotient(std::move(r), divisor) : LossValue(0.0 / divisor);
}
double squared_norm(const Tensor& x) { return wait_for_sum(device_sum(x, reduce::Square{}, "squared_norm")); }
bool any_nonfinite(const Tensor& x) { return device_nonfinite<false>(x, 1.f, "any_nonfinite"); }
bool unscale_and_check(Tensor& g, float inv_scale) { return device_nonfinite<true>(g, inv_scale, "unscale_and_check"); }

bool unscale_and_check_all(const std::vector<Tensor*>& grads, float inv_scale) {
  // Every tensor's kernel raises the same flag on the first tensor's stream; the
  // host reads it once.
  const Tensor& first = *grads.front();
  Workspace ws(first.device(), sizeof(unsigned));
  unsigned* flag = ws.as<unsigned>();
  const cudaStream_t s = gpu::stream_of(first);
  HR_CUDA_CHECK(cudaMemsetAsync(flag, 0, sizeof(unsigned), s));
  for (Tensor* g : grads) launch_nonfinite<true>(*g, inv_scale, flag, s, "unscale_and_check_all");
  unsigned found = 0;
  first.device().copy_to_host(&found, flag, sizeof found);
  return found != 0;
}

}  // namespace hr::ops::cuda
