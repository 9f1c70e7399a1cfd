// CUDA entry points of attention (kernels/attention/attention.cu), as plain C++
// so attention.cpp can call them without CUDA headers. Arguments are checked by
// the caller; tensors are contiguous [B, H, T, D] on one CUDA device.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "harness/tensor.hpp"
#include "kernels/softmax/softmax.hpp"

namespace hr::ops::cuda {

// Memory-efficient forward: out and lse (fp32 [B, H, T]) written.
void attention_mem_efficient_forward(const Tensor& q, const Tensor& k, const Tensor& v, const AttnMask& mask,
                                     float scale, Tensor& out, Tensor& lse);
// Memory-efficient backward: dq, dk, dv overwritten; with the own kernels,
// deterministic (no atomics).
void attention_mem_efficient_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                                      const Tensor& dout, const AttnMask& mask, float scale, const Tensor& lse,
                                      Tensor& dq, Tensor& dk, Tensor& dv);
// Whether the tensor-core kernels can take q on this device (fp16 or bf16, head dim
// <= 128, compute capability 8.0 or newer, code for it compiled from compute_80 or
// newer, enough shared memory per block); when not, `why` (if given) says why and
// the scalar kernels run instead.
bool tensor_core_attention_available(const Tensor& q, std::string* why = nullptr);
// What one tensor-core kernel was built with (ptxas's registers and local memory,
// its dynamic shared memory) and how many of its blocks one SM of a device holds at
// once, beside the number it was built for (its __launch_bounds__ minimum). Local
// bytes above zero mean spills; fewer blocks than designed, an occupancy lost.
struct TcKernelResources {
  const char* kernel = "";  // "forward", "dq" or "dkv"
  int registers = 0;        // per thread
  size_t local_bytes = 0;   // per thread
  size_t smem_bytes = 0;    // dynamic, per block
  int binary_cc = 0;                // the architecture of the code that runs (e.g. 90)
  int code_cc = 0;                  // the virtual architecture it was compiled from (compute_XX)
  size_t design_sm_smem_bytes = 0;  // the shared memory per SM its design assumed
  int design_blocks = 0;
  int blocks_per_sm = 0;
  size_t sm_smem_bytes = 0;  // the device's shared memory per SM
};
// The three kernels (forward, dQ, dK/dV) for dt (f16 or bf16) at head dim D's
// bucket on CUDA device `device`; throws where the kernels cannot run there.
std::vector<TcKernelResources> tensor_core_kernel_resources(int device, DType dt, int64_t D);
// cuDNN's fused attention (the cuDNN frontend's SDPA graphs, attention_cudnn.cpp),
// timed beside the own kernels: fp16 or bf16, head dim a multiple of 8 up to 128,
// the causal and the padding masks (not packing's segment masks; cuDNN is given
// the key lengths clamped to [1, T], and the batch rows without a key are then
// written as the own kernels write them: zeros, and an lse of -inf),
// 16-byte aligned operands, compute capability 8.0 or newer, and a libcudnn.so.9
// that loads and builds a small graph on the device (once per device); when not,
// `why` (if given) says why. The graphs are built on first use per shape and kept.
// Its backward asks for cuDNN's deterministic algorithm, so that it repeats bit for
// bit as the own kernels do (the properties that compare gradients bitwise need
// it): on Hopper, cuDNN 9.25 and newer order the dQ sums with a workspace linear in
// T; older ones keep a [B, H, T, T] 16-bit dP buffer in the workspace, which the
// memory accounting counts. The forward's lse is the natural-log row log-sum-exp
// the own kernels save, so either backward can follow either forward. The small
// graphs of the check are a causal bf16 forward and backward, the backward
// deterministic or not as the setting below is (tried once per device and
// setting): where cuDNN has no deterministic backward (the frontend refuses it on
// Blackwell before cuDNN 9.18, and Ampere may lack it), the form is unavailable
// and says why, and a run that asks for it is refused.
bool cudnn_attention_available(const Tensor& q, const AttnMask& mask, std::string* why = nullptr);
// Whether backwards through cuDNN ask for its deterministic algorithm: true unless
// set otherwise (bench_matmul times the non-deterministic one beside it, the form
// FlashAttention-2's figures are of); the graphs of each are built and kept apart.
bool cudnn_attention_deterministic();
void set_cudnn_attention_deterministic(bool on);
// Sets it for its scope and puts the previous setting back, a throw included.
class ScopedCudnnDeterminism {
 public:
  explicit ScopedCudnnDeterminism(bool on) : before_(cudnn_attention_deterministic()) {
    set_cudnn_attention_deterministic(on);
  }
  ~ScopedCudnnDeterminism() { set_cudnn_attention_deterministic(before_); }
  ScopedCudnnDeterminism(const ScopedCudnnDeterminism&) = delete;
  ScopedCudnnDeterminism& operator=(const ScopedCudnnDeterminism&) = delete;

 private:
  bool before_;
};
// "cuDNN 9.10.2" for the library loaded (loading it on first call), "" where none loads.
std::string cudnn_attention_library();
// How many cuDNN attention graphs this process has run (forward and backward each
// count one): what tells a test that cuDNN ran, not a fallback.
uint64_t cudnn_attention_executions();
// How many of them were backwards through a graph built with cuDNN's deterministic
// algorithm asked for.
uint64_t cudnn_attention_deterministic_backwards();
// The built graphs: at most `capacity` are kept (128 unless set), the least recently
// used pushed out first and destroyed once their device has finished what was
// queued; a shape whose graphs were pushed out builds them again when it next runs.
struct CudnnGraphCache {
  uint64_t built = 0;       // graphs built by this process
  uint64_t pushed_out = 0;  // of them, pushed out of the cache
  size_t held = 0, capacity = 0;
};
CudnnGraphCache cudnn_attention_graph_cache();
// Sets the capacity (at least 1), pushing out what is over it; returns the previous.
size_t set_cudnn_attention_graph_capacity(size_t capacity);
// As attention_mem_efficient_forward / _backward, through cuDNN; the caller has
// checked cudnn_attention_available. False, having run nothing, where cuDNN builds
// no graph for this shape, mask and scale (said once on stderr, and in *why): the
// caller runs the scalar kernels instead.
bool cudnn_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const AttnMask& mask, float scale,
                             Tensor& out, Tensor& lse, std::string* why = nullptr);
bool cudnn_attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                              const Tensor& dout, const AttnMask& mask, float scale, const Tensor& lse, Tensor& dq,
                              Tensor& dk, Tensor& dv, std::string* why = nullptr);
// The lengths cuDNN's padding mask reads, on the key lengths' stream: seq_q (int32
// [B]) all T, seq_kv the key lengths clamped to [1, T].
void cudnn_padding_lengths(const Tensor& key_valid_len, int64_t T, Tensor& seq_q, Tensor& seq_kv);
// Largest head dimension the CUDA memory-efficient kernels take.
inline constexpr int64_t kMaxHeadDim = 128;

// x [B, T, H*D] <-> y [B, H, T, D].
void split_heads(const Tensor& x, int64_t heads, Tensor& y);
void merge_heads(const Tensor& y, Tensor& x);

}  // namespace hr::ops::cuda
