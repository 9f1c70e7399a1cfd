// Memory-efficient attention on the GPU: the dispatch by dtype, head-dim bucket and
// kernel form (scalar, tensor cores or cuDNN for fp16/bf16: ops::gpu_attention_kernel()),
// D_i = rowsum(dO * O) for the backward pass, and the head moves. The kernels
// themselves (attention_kernels.cuh, attention_tc_kernels.cuh) are compiled per
// bucket in their own files.
#include <array>
#include <atomic>
#include <climits>
#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "harness/cuda_check.cuh"
#include "harness/kernel_calls.hpp"
#include <fmt/format.h>

#include "kernels/attention/attention.hpp"
#include "kernels/attention/attention_cuda.hpp"
#include "kernels/attention/attention_launch.hpp"
#include "kernels/attention/attention_math.hpp"
#include "kernels/common/dtype_dispatch.hpp"
#include "kernels/common/float16.hpp"
#include "kernels/common/op_fault.hpp"

namespace hr::ops::cuda {
namespace {

using attn_kernels::kRows;
using attn_kernels::Launch;
using attn_kernels::MaskArgs;
using attn_kernels::backward_launch;
using attn_kernels::forward_launch;
using attn_kernels::with_head_dim;

MaskArgs mask_args(const AttnMask& m) {
  return MaskArgs{m.causal, m.key_valid_len.defined() ? m.key_valid_len.data_as<int32_t>() : nullptr,
                  m.segment_ids.defined() ? m.segment_ids.data_as<int32_t>() : nullptr};
}

// D_i = rowsum(dO * O) per query row (rows = B * H * T).
template <typename S>
__global__ void row_dot_kernel(const S* __restrict__ dout, const S* __restrict__ out, int64_t rows, int D,
                               float* __restrict__ row_dot) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  float s = 0.f;
  for (int d = 0; d < D; ++d) s += to_float(dout[r * D + d]) * to_float(out[r * D + d]);
  row_dot[r] = s;
}

Launch launch_of(const Tensor& q) {
  HR_CHECK(q.dim(3) <= kMaxHeadDim, "memory-efficient attention on CUDA takes head dim <= {}, got {}", kMaxHeadDim,
           q.str());
  HR_CHECK(q.dim(0) * q.dim(1) < INT32_MAX && q.numel() < (int64_t{1} << 62), "attention: {} too large", q.str());
  Launch l;
  l.H = static_cast<int>(q.dim(1));
  l.T = static_cast<int>(q.dim(2));
  l.D = static_cast<int>(q.dim(3));
  l.grid = dim3(static_cast<unsigned>(q.dim(0) * q.dim(1)), static_cast<unsigned>((l.T + kRows - 1) / kRows));
  l.stream = static_cast<cudaStream_t>(q.device().cuda_stream());
  return l;
}

// y (index order b, h, t, d) from x (b, t, h, d) or back: one element per thread,
// moved as raw bits of `E` (2 or 4 bytes). I is the index type: 32-bit wherever the
// tensor allows, since the four divisions per element are the kernel's main cost
// in 64 bits.
template <typename E, bool kSplit, typename I>
__global__ void head_move_kernel(const E* __restrict__ src, E* __restrict__ dst, I n, I H, I T, I D) {
  const I i = static_cast<I>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  // i indexes y [B, H, T, D].
  const I d = i % D, t = (i / D) % T, h = (i / (D * T)) % H, b = i / (D * T * H);
  const I j = ((b * T + t) * H + h) * D + d;  // the same element in x [B, T, H*D]
  if (kSplit)
    dst[i] = src[j];
  else
    dst[j] = src[i];
}

template <typename E, bool kSplit>
void head_move_launch(const Tensor& src, Tensor& dst, int64_t n, int64_t H, int64_t T, int64_t D,
                      cudaStream_t stream) {
  const unsigned blocks = static_cast<unsigned>((n + 255) / 256);
  if (n <= INT32_MAX)
    head_move_kernel<E, kSplit, uint32_t><<<blocks, 256, 0, stream>>>(
        src.data_as<E>(), dst.data_as<E>(), static_cast<uint32_t>(n), static_cast<uint32_t>(H),
        static_cast<uint32_t>(T), static_cast<uint32_t>(D));
  else
    head_move_kernel<E, kSplit, int64_t><<<blocks, 256, 0, stream>>>(src.data_as<E>(), dst.data_as<E>(), n, H, T, D);
}

template <bool kSplit>
void head_move(const Tensor& src, Tensor& dst, int64_t H, int64_t T, int64_t D) {
  const int64_t n = src.numel();
  if (n == 0) return;
  auto stream = static_cast<cudaStream_t>(src.device().cuda_stream());
  if (dtype_size(src.dtype()) == 2)
    head_move_launch<uint16_t, kSplit>(src, dst, n, H, T, D, stream);
  else
    head_move_launch<uint32_t, kSplit>(src, dst, n, H, T, D, stream);
  HR_CUDA_CHECK_LAUNCH();
}

// cuDNN's padding mask reads a query and a key length per batch row: every query
// row live (T), and the key lengths clamped to [1, T]. The own kernels see keys
// s < min(len, T) and write zeros where none is visible; cuDNN leaves such a row
// undefined and takes no length above T, so a row without keys runs with one key
// and clear_keyless_kernel then writes what the own kernels write.
__global__ void cudnn_lengths_kernel(const int32_t* __restrict__ len, int B, int T, int32_t* __restrict__ seq_q,
                                     int32_t* __restrict__ seq_kv) {
  const int b = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (b >= B) return;
  seq_q[b] = T;
  seq_kv[b] = min(max(len[b], 1), T);
}

// One block per batch row (blockIdx.x): where its key length is <= 0, its slice of
// each 16-bit tensor (per_batch elements) set to `fill` (the bits of 0 unless a
// fault asks for other), and its lse (lse_per_batch elements, if given) to -inf.
// The blocks of other rows return at once: one small launch beside cuDNN's.
__global__ void clear_keyless_kernel(const int32_t* __restrict__ len, int64_t per_batch, uint16_t* a, uint16_t* b,
                                     uint16_t* c, uint16_t fill, float* lse, int64_t lse_per_batch) {
  const int64_t row = blockIdx.x;
  if (len[row] > 0) return;
  for (int64_t i = threadIdx.x; i < per_batch; i += blockDim.x) {
    const int64_t at = row * per_batch + i;
    if (a != nullptr) a[at] = fill;
    if (b != nullptr) b[at] = fill;
    if (c != nullptr) c[at] = fill;
    if (lse != nullptr && i < lse_per_batch) lse[row * lse_per_batch + i] = -INFINITY;
  }
}

// What the own kernels write in each batch row with no visible key, after cuDNN ran
// (outs: its 16-bit outputs; lse: the forward's statistics, or null). An
// OpFault::keyless_fill of `op` writes that value instead of 0 (the controls of the
// check that these rows are zeros).
void clear_keyless_batches(const char* op, const Tensor& key_valid_len, std::initializer_list<Tensor*> outs,
                           Tensor* lse) {
  const Tensor& first = **outs.begin();
  const int64_t B = first.dim(0), per_batch = first.numel() / B;
  HR_CHECK(B < INT32_MAX, "attention: {} batch rows", B);
  uint16_t* p[3] = {nullptr, nullptr, nullptr};
  size_t i = 0;
  for (Tensor* t : outs) p[i++] = t->data_as<uint16_t>();
  const OpFault* f = op_fault(op);
  uint16_t fill = 0;
  if (f != nullptr && f->keyless_fill != 0) {
    const float v = static_cast<float>(f->keyless_fill);
    fill = first.dtype() == DType::f16 ? float_to_half_bits(v) : float_to_bf16_bits(v);
  }
  clear_keyless_kernel<<<static_cast<unsigned>(B), 256, 0,
                         static_cast<cudaStream_t>(first.device().cuda_stream())>>>(
      key_valid_len.data_as<int32_t>(), per_batch, p[0], p[1], p[2], fill,
      lse != nullptr ? lse->data_as<float>() : nullptr, lse != nullptr ? lse->numel() / B : 0);
  HR_CUDA_CHECK_LAUNCH();
}

template <int kD>
size_t tc_smem_bytes() {
  return attn_tc::max_smem_bytes<kD>();
}

// Which kernels run: the form asked for where it can take the inputs, the scalar
// kernels otherwise (fp32 always). cuDNN also needs every other operand 16-byte
// aligned (cudnn_attention_available looks at q).
enum class Form { scalar, tensor_core, cudnn };
// The form a call of `op` ("attention_forward") runs in; where that is not the form
// asked for, the fallback is counted with why (kernel_calls.hpp). The setting
// chooses among the forms of fp16 and bf16: fp32 has the scalar kernels alone, and
// takes them without a fallback.
Form form_of(const char* op, const Tensor& q, const AttnMask& mask, std::initializer_list<const Tensor*> others) {
  if (q.dtype() == DType::f32) return Form::scalar;
  std::string why;
  switch (ops::gpu_attention_kernel()) {
    case ops::GpuAttentionKernel::tensor_core:
      if (tensor_core_attention_available(q, &why)) return Form::tensor_core;
      count_kernel_fallback(fmt::format("{}:tensor_core", op).c_str(), why);
      return Form::scalar;
    case ops::GpuAttentionKernel::cudnn:
      for (const Tensor* t : others)
        if (reinterpret_cast<uintptr_t>(t->data()) % 16 != 0) {
          count_kernel_fallback(fmt::format("{}:cudnn", op).c_str(), "an operand not 16-byte aligned");
          return Form::scalar;
        }
      if (cudnn_attention_available(q, mask, &why)) return Form::cudnn;
      count_kernel_fallback(fmt::format("{}:cudnn", op).c_str(), why);
      return Form::scalar;
    case ops::GpuAttentionKernel::scalar: break;
  }
  return Form::scalar;
}

// A figure of each device, read once per device: the dispatch asks at every call,
// so the lookup takes no lock (two threads that both find it unread both read it,
// the same value). Ordinals past the table are read at each call.
class PerDevice {
 public:
  PerDevice() {
    for (auto& v : seen_) v.store(kUnread, std::memory_order_relaxed);
  }
  template <class Read>
  int get(int dev, Read read) {
    if (dev < 0 || dev >= kDevices) return read();
    int v = seen_[static_cast<size_t>(dev)].load(std::memory_order_acquire);
    if (v == kUnread) {
      v = read();
      seen_[static_cast<size_t>(dev)].store(v, std::memory_order_release);
    }
    return v;
  }

 private:
  static constexpr int kDevices = 64;
  static constexpr int kUnread = INT_MIN;
  std::array<std::atomic<int>, kDevices> seen_;
};

// A device's shared memory per block with the opt-in (the compute capability is in
// the device record).
int smem_optin(int dev) {
  static PerDevice& seen = *new PerDevice;  // never destroyed: callable during exit
  return seen.get(dev, [dev] {
    int optin = 0;
    HR_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    return optin;
  });
}

// The virtual architecture (compute_XX) of the tensor-core kernels' code that runs
// on a device. A build for no architecture of 8.0 or newer (CMAKE_CUDA_ARCHITECTURES=75
// on an A100, through the driver's compilation of its PTX) has kernels whose bodies
// are traps, though the device could run them.
int tc_code_cc(int dev) {
  static PerDevice& seen = *new PerDevice;
  return seen.get(dev, [dev] { return attn_tc::code_cc<bfloat16_t, 32>(dev); });
}

}  // namespace

bool tensor_core_attention_available(const Tensor& q, std::string* why) {
  auto no = [why](std::string reason) {
    if (why != nullptr) *why = std::move(reason);
    return false;
  };
  if (q.dtype() != DType::f16 && q.dtype() != DType::bf16)
    return no(fmt::format("{} takes the scalar kernels", dtype_name(q.dtype())));
  if (q.ndim() != 4 || q.dim(3) > attn_tc::kMaxTcHeadDim)
    return no(fmt::format("head dim of {} above {}", q.str(), attn_tc::kMaxTcHeadDim));
  // The tensors' device, which need not be the current one.
  const DeviceRecord& rec = q.device().record();
  if (rec.cc_major < 8)
    return no(fmt::format("compute capability {}.{}: the tensor-core kernels (mma.sync, ldmatrix, cp.async) need 8.0 or newer", rec.cc_major, rec.cc_minor));
  if (const int code = tc_code_cc(rec.ordinal); code == 0)
    return no(fmt::format("this build has no code that compute capability {}.{} can run (CMAKE_CUDA_ARCHITECTURES)",
                          rec.cc_major, rec.cc_minor));
  else if (code < 80)
    return no(fmt::format("this build's code for the device comes from compute_{} (CMAKE_CUDA_ARCHITECTURES): the "
                          "tensor-core kernels need compute_80 or newer",
                          code));
  const int optin = smem_optin(rec.ordinal);
  size_t need = 0;
  with_head_dim(static_cast<int>(q.dim(3)), [&](auto kd) { need = tc_smem_bytes<decltype(kd)::value>(); });
  if (static_cast<size_t>(optin) < need)
    return no(fmt::format("{} bytes of shared memory per block, the kernels take {}", optin, need));
  return true;
}

std::vector<TcKernelResources> tensor_core_kernel_resources(int device, DType dt, int64_t D) {
  if (dt != DType::f16 && dt != DType::bf16)
    throw std::invalid_argument(fmt::format("tensor-core attention takes f16 or bf16, not {}", dtype_name(dt)));
  if (D < 1 || D > attn_tc::kMaxTcHeadDim)
    throw std::invalid_argument(fmt::format("head dim {} outside 1..{}", D, attn_tc::kMaxTcHeadDim));
  TcKernelResources r[3];
  with_head_dim(static_cast<int>(D), [&](auto kd) {
    constexpr int kD = decltype(kd)::value;
    if (dt == DType::f16)
      attn_tc::kernel_resources<half_t, kD>(device, r);
    else
      attn_tc::kernel_resources<bfloat16_t, kD>(device, r);
  });
  return {r[0], r[1], r[2]};
}

void attention_mem_efficient_forward(const Tensor& q, const Tensor& k, const Tensor& v, const AttnMask& mask,
                                     float scale, Tensor& out, Tensor& lse) {
  if (q.numel() == 0) return;
  const Launch l = launch_of(q);
  const Form form = form_of("attention_forward", q, mask, {&k, &v, &out});
  if (form == Form::cudnn) {
    std::string why;
    if (cudnn_attention_forward(q, k, v, mask, scale, out, lse, &why)) {
      count_kernel_call("attention_forward:cudnn");
      if (mask.key_valid_len.defined()) clear_keyless_batches("attention_forward", mask.key_valid_len, {&out}, &lse);
      return;
    }
    count_kernel_fallback("attention_forward:cudnn", why);
  }
  const MaskArgs m = mask_args(mask);
  const bool tc = form == Form::tensor_core;
  count_kernel_call(tc ? "attention_forward:tensor_core" : "attention_forward:scalar");
  dispatch_float(q.dtype(), "attention_forward", [&](auto tag) {
    using S = decltype(tag);
    with_head_dim(l.D, [&](auto kd) {
      constexpr int kD = decltype(kd)::value;
      if constexpr (!std::is_same_v<S, float>) {
        if (tc) return attn_tc::forward_launch<S, kD>(l, q, k, v, m, scale, out, lse);
      }
      forward_launch<S, kD>(l, q, k, v, m, scale, out, lse);
    });
  });
}

void attention_mem_efficient_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                                      const Tensor& dout, const AttnMask& mask, float scale, const Tensor& lse,
                                      Tensor& dq, Tensor& dk, Tensor& dv) {
  if (q.numel() == 0) return;
  const Form form = form_of("attention_backward", q, mask, {&k, &v, &out, &dout, &dq, &dk, &dv});
  if (form == Form::cudnn) {
    std::string why;
    if (cudnn_attention_backward(q, k, v, out, dout, mask, scale, lse, dq, dk, dv, &why)) {
      count_kernel_call("attention_backward:cudnn");
      if (mask.key_valid_len.defined())
        clear_keyless_batches("attention_backward", mask.key_valid_len, {&dq, &dk, &dv}, nullptr);
      return;
    }
    count_kernel_fallback("attention_backward:cudnn", why);
  }
  const Launch l = launch_of(q);
  const MaskArgs m = mask_args(mask);
  const int64_t rows = q.dim(0) * q.dim(1) * q.dim(2);
  const bool tc = form == Form::tensor_core;
  count_kernel_call(tc ? "attention_backward:tensor_core" : "attention_backward:scalar");
  Tensor row_dot = Tensor::empty(q.device(), {rows}, DType::f32, Consumer::workspace);
  dispatch_float(q.dtype(), "attention_backward", [&](auto tag) {
    using S = decltype(tag);
    row_dot_kernel<S><<<static_cast<unsigned>((rows + 255) / 256), 256, 0, l.stream>>>(
        dout.data_as<S>(), out.data_as<S>(), rows, l.D, row_dot.data_as<float>());
    HR_CUDA_CHECK_LAUNCH();
    with_head_dim(l.D, [&](auto kd) {
      constexpr int kD = decltype(kd)::value;
      if constexpr (!std::is_same_v<S, float>) {
        if (tc) return attn_tc::backward_launch<S, kD>(l, q, k, v, dout, lse, row_dot, m, scale, dq, dk, dv);
      }
      backward_launch<S, kD>(l, q, k, v, dout, lse, row_dot, m, scale, dq, dk, dv);
    });
  });
}

void cudnn_padding_lengths(const Tensor& key_valid_len, int64_t T, Tensor& seq_q, Tensor& seq_kv) {
  const int B = static_cast<int>(key_valid_len.numel());
  cudnn_lengths_kernel<<<static_cast<unsigned>((B + 255) / 256), 256, 0,
                         static_cast<cudaStream_t>(key_valid_len.device().cuda_stream())>>>(
      key_valid_len.data_as<int32_t>(), B, static_cast<int>(T), seq_q.data_as<int32_t>(), seq_kv.data_as<int32_t>());
  HR_CUDA_CHECK_LAUNCH();
}

void split_heads(const Tensor& x, int64_t heads, Tensor& y) {
  head_move<true>(x, y, heads, y.dim(2), y.dim(3));
}

void merge_heads(const Tensor& y, Tensor& x) { head_move<false>(y, x, y.dim(1), y.dim(2), y.dim(3)); }

}  // namespace hr::ops::cuda
