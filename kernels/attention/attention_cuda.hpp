// CUDA entry points of attention (kernels/attention/attention.cu), as plain C++
// so attention.cpp can call them without CUDA headers. Arguments are checked by
// the caller; tensors are contiguous [B, H, T, D] on one CUDA device.
#pragma once

#include "harness/tensor.hpp"
#include "kernels/softmax/softmax.hpp"

namespace hr::ops::cuda {

// Memory-efficient forward: out and lse (fp32 [B, H, T]) written.
void attention_mem_efficient_forward(const Tensor& q, const Tensor& k, const Tensor& v, const AttnMask& mask,
                                     float scale, Tensor& out, Tensor& lse);
// Memory-efficient backward: dq, dk, dv overwritten; deterministic (no atomics).
void attention_mem_efficient_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                                      const Tensor& dout, const AttnMask& mask, float scale, const Tensor& lse,
                                      Tensor& dq, Tensor& dk, Tensor& dv);
// Largest head dimension the CUDA memory-efficient kernels take.
inline constexpr int64_t kMaxHeadDim = 128;

// x [B, T, H*D] <-> y [B, H, T, D].
void split_heads(const Tensor& x, int64_t heads, Tensor& y);
void merge_heads(const Tensor& y, Tensor& x);

}  // namespace hr::ops::cuda
