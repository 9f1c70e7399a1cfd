// Memory-efficient attention on the GPU: what the dispatcher (attention.cu) and the
// kernel translation units (attention_{fwd,bwd}_d{32,64,128}.cu for the scalar
// kernels, attention_tc_d{32,64,128}.cu for the tensor-core ones) share. The kernels
// are instantiated per head-dim bucket in their own files, so nvcc compiles them in
// parallel; attention.cu sees only these declarations.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "harness/tensor.hpp"
#include "kernels/attention/attention_cuda.hpp"

namespace hr::ops::cuda::attn_kernels {

constexpr int kRows = 64;   // rows per block (a thread or a few a row)
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

// fn(std::integral_constant<int, kD>) with the head-dim bucket kD >= D whose
// kernels run head dim D, and what it returns.
template <typename Fn>
decltype(auto) with_head_dim(int D, Fn&& fn) {
  if (D <= 32) return fn(std::integral_constant<int, 32>{});
  if (D <= 64) return fn(std::integral_constant<int, 64>{});
  return fn(std::integral_constant<int, 128>{});
}

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

// The tensor-core kernels (attention_tc_kernels.cuh): fp16 and bf16 only, sm_80 and
// newer. A block is kWarps warps over a tile of kTile query rows (or keys), 16 a warp.
namespace hr::ops::cuda::attn_tc {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kTile = kWarps * 16;  // rows per block, and keys (or queries) per step
constexpr int kMaxTcHeadDim = 128;

// The row stride in elements of the 16-bit [kTile][kD] tiles of Q, K, V and dO in
// shared memory: 16 bytes of padding make ldmatrix's eight 16-byte rows fall in
// distinct banks, and keep every row 16-byte aligned for cp.async.
template <int kD>
constexpr int kLdIn = kD + 8;

template <int kD>
constexpr size_t in_tile_bytes() {
  return static_cast<size_t>(kTile) * kLdIn<kD> * 2;
}
// Dynamic shared memory of each kernel: its resident tiles and two buffers of each
// streamed one (at head dim 128: 85, 102 and 103 KiB, so two blocks fit an H100's or
// H200's 228 KiB; an A100 opts in to 163 KiB); the dispatcher checks them against
// the device. The outputs stage through the warp's own rows of a resident tile.
template <int kD>
constexpr size_t forward_smem_bytes() {  // Q; K and V twice
  return 5 * in_tile_bytes<kD>();
}
template <int kD>
constexpr size_t dq_smem_bytes() {  // Q and dO; K and V twice
  return 6 * in_tile_bytes<kD>();
}
template <int kD>
constexpr size_t dkv_smem_bytes() {  // K and V; Q and dO twice, with their rows' lse and D
  return 6 * in_tile_bytes<kD>() + 4 * kTile * sizeof(float);
}
// The queries the dK/dV kernel takes at once within a step of kTile: its scores and
// dP^T for them stay in registers beside the two fp32 accumulators (kD / 2 floats a
// lane each).
constexpr int kDkvPart = 32;
// The blocks per SM the kernels' registers are designed for (a lane holds its
// accumulators, a step's scores and the operands in flight): the forward four at
// head dim 32 (128 registers a thread) and three above (168), the backward three
// up to 64 and two at 128 (255). At head dim 128 the forward's shared memory holds
// it to two as well. ptxas, sm_90: 128 registers for the forward at 32, 155 at 64,
// 178 at 128; 128-168 for the backward up to 64, 240-243 at 128; no spills.
template <int kD>
constexpr int kForwardRegBlocks = kD <= 32 ? 4 : 3;
template <int kD>
constexpr int kBackwardRegBlocks = kD <= 64 ? 3 : 2;
// The shared memory one SM holds at compute capability cc (major * 10 + minor), per
// the CUDA programming guide's table: 164 KiB on sm_80 and sm_87, 228 KiB from
// sm_90 to sm_110, 100 KiB on sm_86, sm_89 and sm_120 (64 KiB below sm_80, where
// the tensor-core kernels do not run). The test reads the device's own figure back
// against it.
constexpr size_t sm_smem_bytes_of(int cc) {
  return cc < 80                 ? 64u * 1024u
         : cc == 80 || cc == 87  ? 164u * 1024u
         : cc >= 90 && cc < 120  ? 228u * 1024u
                                 : 100u * 1024u;
}
// The architecture this pass compiles for (the host pass takes sm_90's figures;
// it only reads them for a device's report, through the kernel's binary version).
#if defined(__CUDA_ARCH__)
constexpr int kBuildCc = __CUDA_ARCH__ / 10;
#else
constexpr int kBuildCc = 90;
#endif
// The blocks per SM each kernel is built for, its __launch_bounds__ minimum: as
// many as its shared memory lets an SM of the target architecture hold (1 KiB of it
// reserved per block), at most what its registers are designed for (reg_blocks).
constexpr int design_blocks(size_t smem_bytes, int reg_blocks, int cc = kBuildCc) {
  const size_t n = sm_smem_bytes_of(cc) / (smem_bytes + 1024u);
  return n > static_cast<size_t>(reg_blocks) ? reg_blocks : (n < 1 ? 1 : static_cast<int>(n));
}
// The most any of them takes at head-dim bucket kD.
template <int kD>
constexpr size_t max_smem_bytes() {
  const size_t a = forward_smem_bytes<kD>(), b = dq_smem_bytes<kD>(), c = dkv_smem_bytes<kD>();
  return a > b ? (a > c ? a : c) : (b > c ? b : c);
}

using attn_kernels::Launch;
using attn_kernels::MaskArgs;

// Instantiated for S in {half_t, bfloat16_t}, kD in {32, 64, 128} by
// HR_ATTENTION_TC_INSTANTIATE; the grid's y extent is recomputed for kTile.
template <typename S, int kD>
void forward_launch(const Launch& l, const Tensor& q, const Tensor& k, const Tensor& v, const MaskArgs& m,
                    float scale, Tensor& out, Tensor& lse);
template <typename S, int kD>
void backward_launch(const Launch& l, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& dout,
                     const Tensor& lse, const Tensor& row_dot, const MaskArgs& m, float scale, Tensor& dq, Tensor& dk,
                     Tensor& dv);
// The forward, dQ and dK/dV kernels' resources on device `device`, in that order.
template <typename S, int kD>
void kernel_resources(int device, TcKernelResources (&out)[3]);
// The virtual architecture (compute_XX, e.g. 90) of the forward kernel's code that
// runs on device `device`, or 0 where the build has no code the device can run (the
// CUDA error cleared): a query, which answers and does not throw.
template <typename S, int kD>
int code_cc(int device);

}  // namespace hr::ops::cuda::attn_tc
