// Memory-efficient attention on the GPU: what the dispatcher (attention.cu) and the
// kernel translation units (attention_{fwd,bwd}_d{32,64,128}.cu) share. The kernels
// are instantiated per head-dim bucket in their own files, so nvcc compiles them in
// parallel; attention.cu sees only these declarations.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "harness/tensor.hpp"

namespace hr::ops::cuda::attn_kernels {

constexpr int kRows = 64;   // rows per block, one per thread
constexpr int kChunk = 32;  // rows of the other operand staged in shared memory per step

struct MaskArgs {
  bool causal;
  const int32_t* kv_len;  // [B] or nullptr
  const int32_t* seg;     // [B, T] or nullptr
};

struct Launch {
  int H, T, D;
  dim3 grid;
  cudaStream_t stream;
};

// Defined in attention_kernels.cuh; instantiated for S in {float, half_t,
// bfloat16_t} and kD in {32, 64, 128} by HR_ATTENTION_INSTANTIATE_FWD / _BWD.
template <typename S, int kD>
void forward_launch(const Launch& l, const Tensor& q, const Tensor& k, const Tensor& v, const MaskArgs& m,
                    float scale, Tensor& out, Tensor& lse);
template <typename S, int kD>
void backward_launch(const Launch& l, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& dout,
                     const Tensor& lse, const Tensor& row_dot, const MaskArgs& m, float scale, Tensor& dq, Tensor& dk,
                     Tensor& dv);

}  // namespace hr::ops::cuda::attn_kernels
