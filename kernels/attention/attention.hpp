// Multi-head attention core, O = softmax(scale * Q K^T + mask) V, per (b, h), in
// two forms:
// - naive: the scores and probabilities [B, H, T, T] are materialised (cuBLAS /
//   CBLAS batched products + softmax); probs is kept for the backward pass;
// - memory_efficient: keys processed in chunks with an online softmax (Rabe &
//   Staats 2021; FlashAttention-style), never holding T x T; only the row
//   log-sum-exp [B, H, T] is kept and the backward pass recomputes per chunk.
// Q, K, V, O: [B, H, T, D] contiguous. Also the [B, T, H*D] <-> [B, H, T, D] moves.
#pragma once

#include <functional>
#include <optional>
#include <string>

#include "harness/tensor.hpp"
#include "kernels/softmax/softmax.hpp"

namespace hr::ops {

enum class AttentionImpl { naive, memory_efficient };
const char* attention_impl_name(AttentionImpl a);  // "naive" | "memory_efficient"

// What the forward pass keeps for the backward pass.
struct AttentionSaved {
  Tensor probs;  // naive: [B, H, T, T] (the caller's consumer, usually activations)
  Tensor lse;    // memory_efficient: fp32 [B, H, T]
};

// Dropout on the attention probabilities (GPT-2's attn_dropout), naive form only:
// O = drop(P) V, where `forward` writes drop(x) into y and `backward` the gradient
// through the same mask (both [B, H, T, T]; backward may run in place). The caller
// owns the mask (it replays it from its RNG state); the undropped P is what is kept.
// Empty: no dropout. The memory-efficient form refuses it (InvalidArgument).
struct AttnProbDropout {
  std::function<void(const Tensor& x, Tensor& y)> forward;
  std::function<void(const Tensor& dy, Tensor& dx)> backward;
  bool enabled() const { return static_cast<bool>(forward); }
};

// Which kernels run the memory-efficient form in fp16 and bf16 on a GPU:
// - scalar: a thread (or, at large head dims, a few lanes) per query row, fp32
//   arithmetic (attention_kernels.cuh);
// - tensor_core: FlashAttention-2's form on mma.sync, tiles of 64 rows, scores, P
//   and dS in registers, P and dS rounded to 16 bits before their products
//   (attention_tc_kernels.cuh; sm_80 and newer, head dim <= 128; elsewhere the
//   scalar kernels run).
// - cudnn: cuDNN's fused attention, loaded at run time (attention_cuda.hpp says
//   what it takes; elsewhere the scalar kernels run). A library kernel timed beside
//   the own ones; they stay the reference it is checked against.
// fp32 and the CPU always take the scalar form. The conformance tests run every
// form (the tensor-core kernels' code also on emulated warps, on any machine); the
// default is tensor_core (their WMMA predecessor passed every conformance case on
// an H100), where a run's device cannot take it the scalar kernels
// (require_attention_kernel in the CLI). The environment's
// HEADROOM_ATTENTION_KERNEL=scalar|tensor_core|cudnn sets the starting value.
enum class GpuAttentionKernel { scalar, tensor_core, cudnn };
const char* gpu_attention_kernel_name(GpuAttentionKernel k);  // "scalar" | "tensor_core" | "cudnn"
// The kernel a name stands for, or nothing for a name that is none of them.
std::optional<GpuAttentionKernel> parse_gpu_attention_kernel(const std::string& name);
GpuAttentionKernel gpu_attention_kernel();
void set_gpu_attention_kernel(GpuAttentionKernel k);
// True while neither HEADROOM_ATTENTION_KERNEL nor set_gpu_attention_kernel chose.
bool gpu_attention_kernel_is_default();
// Whether `kernel` can run the memory-efficient form in dt at head dim D on dev (a
// CUDA device; aligned [1, 1, 8, D] inputs under no mask stand for a run's), else
// why not in `why` (if given). The scalar kernels always can.
bool gpu_attention_kernel_available(Device& dev, GpuAttentionKernel kernel, DType dt, int64_t D,
                                    std::string* why = nullptr);
// Sets the kernels for its scope and puts the previous setting back, a throw included.
// Puts back a setting read earlier, whether it was still the default included.
void restore_gpu_attention_kernel(GpuAttentionKernel k, bool is_default);
class ScopedGpuAttentionKernel {
 public:
  explicit ScopedGpuAttentionKernel(GpuAttentionKernel k)
      : before_(gpu_attention_kernel()), was_default_(gpu_attention_kernel_is_default()) {
    set_gpu_attention_kernel(k);
  }
  ~ScopedGpuAttentionKernel() { restore_gpu_attention_kernel(before_, was_default_); }
  ScopedGpuAttentionKernel(const ScopedGpuAttentionKernel&) = delete;
  ScopedGpuAttentionKernel& operator=(const ScopedGpuAttentionKernel&) = delete;

 private:
  GpuAttentionKernel before_;
  bool was_default_;
};

// `saved` tensors are allocated by the op with consumer `saved_consumer`.
void attention_forward(AttentionImpl impl, const Tensor& q, const Tensor& k, const Tensor& v, const AttnMask& mask,
                       float scale, Tensor& out, AttentionSaved& saved, Consumer saved_consumer,
                       const AttnProbDropout& drop = {});
// dq, dk, dv overwritten.
void attention_backward(AttentionImpl impl, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                        const Tensor& dout, const AttnMask& mask, float scale, const AttentionSaved& saved,
                        Tensor& dq, Tensor& dk, Tensor& dv, const AttnProbDropout& drop = {});

// x [B, T, H*D] -> y [B, H, T, D] and back.
void split_heads(const Tensor& x, int64_t heads, Tensor& y);
void merge_heads(const Tensor& y, Tensor& x);

}  // namespace hr::ops
