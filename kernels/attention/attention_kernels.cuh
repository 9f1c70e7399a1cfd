// Memory-efficient attention's kernels on the GPU. Forward: one block per
// (b*h, tile of kRows query rows), one thread per query row; K and V pass through
// shared memory kChunk keys at a time (fp32, zero-padded to the head-dim bucket
// kD), the online softmax state lives in registers. Backward (FlashAttention-2):
// D_i = rowsum(dO * O), then one kernel computes dQ per query tile and another dK,
// dV per key tile, each thread owning its row: deterministic, no atomics.
// This header holds the kernels and their launchers; include it only from the
// per-pass, per-head-dim translation units, which instantiate them
// (HR_ATTENTION_INSTANTIATE_FWD / _BWD), or after the warp emulation
// (suites/common/warp_emulation.hpp, HR_WARP_EMULATION: the kernels on emulated
// threads of a CPU, without their launchers).
#pragma once

#include <cstdint>

#if !defined(HR_WARP_EMULATION)
#include "harness/cuda_check.cuh"
#endif
#include "kernels/attention/attention_launch.hpp"
#include "kernels/attention/attention_mask.cuh"
#include "kernels/attention/attention_math.hpp"
#include "kernels/common/float16.hpp"
#include "kernels/common/shared_memory.cuh"
#include "kernels/softmax/softmax_math.hpp"

namespace hr::ops::cuda::attn_kernels {

// Rows [r0, r0 + kChunk) of a [T, D] matrix into shared memory as fp32, zero-padded
// past T and past D (so dot products over kD need no bounds).
template <typename S, int kD>
__device__ void stage_rows(const S* src, int r0, int T, int D, float (*dst)[kD]) {
  for (int i = threadIdx.x; i < kChunk * kD; i += blockDim.x) {
    const int r = i / kD, c = i % kD, row = r0 + r;
    dst[r][c] = (row < T && c < D) ? to_float(src[static_cast<int64_t>(row) * D + c]) : 0.f;
  }
}

template <typename S, int kD>
__device__ void load_row(const S* src, bool active, int D, float (&dst)[kD]) {
#pragma unroll
  for (int d = 0; d < kD; ++d) dst[d] = (active && d < D) ? to_float(src[d]) : 0.f;
}

// Where the keys any query row of the block starting at t0 may see end: a causal
// block sees no key past its last row, a batch row none past its length (`rm` is
// one of the block's rows; its length is the batch row's). Uniform across the block.
__device__ inline int block_key_end(const MaskArgs& mask, const sm::RowMask& rm, int t0, int T) {
  return sm::allowed_end(sm::RowMask{mask.causal, min(T, t0 + kRows) - 1, rm.kv_len, nullptr}, T);
}

template <int kD>
__device__ float dot_row(const float (&a)[kD], const float* b) {
  float s = 0.f;
#pragma unroll
  for (int d = 0; d < kD; ++d) s += a[d] * b[d];
  return s;
}

template <typename S, int kD>
__global__ void __launch_bounds__(kRows)
    mem_efficient_forward_kernel(const S* __restrict__ q, const S* __restrict__ k, const S* __restrict__ v,
                                 MaskArgs mask, int H, int T, int D, float scale, S* __restrict__ out,
                                 float* __restrict__ lse) {
  // Keys per step of the online softmax: each step rescales the row's accumulators
  // once. Up to head dim 64 a step is 8 keys, its loops unrolled and its scores in
  // registers, so a rescale adds 8 products to every 128 of a key. All 32 keys of a
  // chunk in one step took 48 s of nvcc for sm_90 at head dim 64 (8 keys: 10 s) and
  // 14 s at 32, spilling 12 bytes (8 keys: 5 s, no spill). At 128 the query row and
  // the accumulators alone fill the 255 registers: one step a chunk, its loops
  // unrolled 4 keys at a time (the scores in local memory). All 32 keys took 8m51s
  // and spilled 2,580 bytes of stores and 6,312 of loads; 4 take 9 s and spill 364
  // and 924; steps of 4 or 8 keys spill more (396 and 1,100; 776 and 2,076).
  constexpr int kStep = kD >= 128 ? kChunk : 8;
  constexpr int kUnroll = kD >= 128 ? 4 : kStep;
  static_assert(kChunk % kStep == 0, "a chunk is whole steps");
  HR_SHARED(float[kChunk][kD], ks);
  HR_SHARED(float[kChunk][kD], vs);
  const int bh = blockIdx.x, b = bh / H;
  const int t0 = blockIdx.y * kRows, t = t0 + static_cast<int>(threadIdx.x);
  const bool active = t < T;
  const int64_t base = static_cast<int64_t>(bh) * T * D;
  float qr[kD], acc[kD];
  load_row<S, kD>(q + base + static_cast<int64_t>(t) * D, active, D, qr);
#pragma unroll
  for (int d = 0; d < kD; ++d) acc[d] = 0.f;
  const sm::RowMask rm = row_mask(mask, b, t, T);
  const int s_end = sm::allowed_end(rm, T);  // no key of this row at or past it (segments allow fewer)
  float m = -INFINITY, l = 0.f;
  const int block_end = block_key_end(mask, rm, t0, T);
  for (int s0 = 0; s0 < block_end; s0 += kChunk) {
    __syncthreads();  // the previous chunk is consumed
    stage_rows<S, kD>(k + base, s0, T, D, ks);
    stage_rows<S, kD>(v + base, s0, T, D, vs);
    __syncthreads();
    if (!active) continue;
#pragma unroll 1
    for (int j0 = 0; j0 < kChunk; j0 += kStep) {
      if (s0 + j0 >= s_end) break;  // this row's last key is behind
      float sc[kStep];
      uint32_t ok = 0;
      float step_max = -INFINITY;
#pragma unroll kUnroll
      for (int j = 0; j < kStep; ++j) {
        const int s = s0 + j0 + j;
        sc[j] = 0.f;
        if (s < T && sm::allowed(rm, s)) {
          ok |= 1u << j;
          sc[j] = scale * dot_row<kD>(qr, ks[j0 + j]);
          step_max = fmaxf(step_max, sc[j]);
        }
      }
      const float factor = attn::online_rescale(m, l, step_max);
      if (ok == 0) continue;
#pragma unroll
      for (int d = 0; d < kD; ++d) acc[d] *= factor;
#pragma unroll kUnroll
      for (int j = 0; j < kStep; ++j) {
        if (!(ok & (1u << j))) continue;
        const float p = attn::online_weight(sc[j], m);
        l += p;
#pragma unroll
        for (int d = 0; d < kD; ++d) acc[d] += p * vs[j0 + j][d];
      }
    }
  }
  if (!active) return;
  const float inv = attn::inv_row_sum(l);
  S* o = out + base + static_cast<int64_t>(t) * D;
#pragma unroll
  for (int d = 0; d < kD; ++d)
    if (d < D) o[d] = from_float<S>(acc[d] * inv);
  lse[static_cast<int64_t>(bh) * T + t] = attn::row_lse(m, l);
}

// Keys (queries) of a chunk per pass of the backward kernels' loops. From head dim
// 64 the rows a thread owns (three in dQ, four in dK/dV) fill the registers, and
// unrolling 4 only spills more: for sm_90 at 128 it took 33 s of nvcc and spilled
// 2,064/9,232 (dQ) and 9,104/16,340 (dK/dV) bytes of stores/loads, one at a time
// takes 9 s and spills 1,336/2,332 and 3,068/4,092; at 64, 12 s and 68/532 and
// 532/3,920 against 6 s and 64/120 and 424/848. At 32 (158-226 registers, no
// spill) four keys' dot products overlap.
template <int kD>
inline constexpr int kBackwardUnroll = kD >= 64 ? 1 : 4;

template <typename S, int kD>
__global__ void __launch_bounds__(kRows)
    mem_efficient_dq_kernel(const S* __restrict__ q, const S* __restrict__ k, const S* __restrict__ v,
                            const S* __restrict__ dout, const float* __restrict__ lse,
                            const float* __restrict__ row_dot, MaskArgs mask, int H, int T, int D, float scale,
                            S* __restrict__ dq) {
  HR_SHARED(float[kChunk][kD], ks);
  HR_SHARED(float[kChunk][kD], vs);
  const int bh = blockIdx.x, b = bh / H;
  const int t0 = blockIdx.y * kRows, t = t0 + static_cast<int>(threadIdx.x);
  const bool active = t < T;
  const int64_t base = static_cast<int64_t>(bh) * T * D;
  float qr[kD], gr[kD], dqr[kD];
  load_row<S, kD>(q + base + static_cast<int64_t>(t) * D, active, D, qr);
  load_row<S, kD>(dout + base + static_cast<int64_t>(t) * D, active, D, gr);
#pragma unroll
  for (int d = 0; d < kD; ++d) dqr[d] = 0.f;
  const sm::RowMask rm = row_mask(mask, b, t, T);
  const float lse_t = active ? lse[static_cast<int64_t>(bh) * T + t] : 0.f;
  const float dot_t = active ? row_dot[static_cast<int64_t>(bh) * T + t] : 0.f;
  const int block_end = block_key_end(mask, rm, t0, T);
  for (int s0 = 0; s0 < block_end; s0 += kChunk) {
    __syncthreads();
    stage_rows<S, kD>(k + base, s0, T, D, ks);
    stage_rows<S, kD>(v + base, s0, T, D, vs);
    __syncthreads();
    if (!active) continue;
#pragma unroll kBackwardUnroll<kD>
    for (int j = 0; j < kChunk; ++j) {
      const int s = s0 + j;
      if (s >= T || !sm::allowed(rm, s)) continue;
      const float p = attn::prob_from_lse(scale * dot_row<kD>(qr, ks[j]), lse_t);
      const float ds = attn::dscore_unscaled(p, dot_row<kD>(gr, vs[j]), dot_t);
#pragma unroll
      for (int d = 0; d < kD; ++d) dqr[d] += ds * ks[j][d];
    }
  }
  if (!active) return;
  S* o = dq + base + static_cast<int64_t>(t) * D;
#pragma unroll
  for (int d = 0; d < kD; ++d)
    if (d < D) o[d] = from_float<S>(scale * dqr[d]);
}

template <typename S, int kD>
__global__ void __launch_bounds__(kRows)
    mem_efficient_dkv_kernel(const S* __restrict__ q, const S* __restrict__ k, const S* __restrict__ v,
                             const S* __restrict__ dout, const float* __restrict__ lse,
                             const float* __restrict__ row_dot, MaskArgs mask, int H, int T, int D, float scale,
                             S* __restrict__ dk, S* __restrict__ dv) {
  HR_SHARED(float[kChunk][kD], qs);
  HR_SHARED(float[kChunk][kD], gs);
  HR_SHARED(float[kChunk], lse_s);
  HR_SHARED(float[kChunk], dot_s);
  const int bh = blockIdx.x, b = bh / H;
  const int s_first = blockIdx.y * kRows, s = s_first + static_cast<int>(threadIdx.x);
  const bool active = s < T;
  const int64_t base = static_cast<int64_t>(bh) * T * D;
  float kr[kD], vr[kD], dkr[kD], dvr[kD];
  load_row<S, kD>(k + base + static_cast<int64_t>(s) * D, active, D, kr);
  load_row<S, kD>(v + base + static_cast<int64_t>(s) * D, active, D, vr);
#pragma unroll
  for (int d = 0; d < kD; ++d) dkr[d] = dvr[d] = 0.f;
  // Causal: queries before this block's first key see none of its keys.
  const int t_begin = mask.causal ? (s_first / kChunk) * kChunk : 0;
  for (int t0 = t_begin; t0 < T; t0 += kChunk) {
    __syncthreads();
    stage_rows<S, kD>(q + base, t0, T, D, qs);
    stage_rows<S, kD>(dout + base, t0, T, D, gs);
    for (int i = threadIdx.x; i < kChunk; i += blockDim.x) {
      const int t = t0 + i;
      lse_s[i] = t < T ? lse[static_cast<int64_t>(bh) * T + t] : 0.f;
      dot_s[i] = t < T ? row_dot[static_cast<int64_t>(bh) * T + t] : 0.f;
    }
    __syncthreads();
    if (!active) continue;
#pragma unroll kBackwardUnroll<kD>
    for (int j = 0; j < kChunk; ++j) {
      const int t = t0 + j;
      if (t >= T || !sm::allowed(row_mask(mask, b, t, T), s)) continue;
      const float p = attn::prob_from_lse(scale * dot_row<kD>(kr, qs[j]), lse_s[j]);
      const float ds = attn::dscore_unscaled(p, dot_row<kD>(vr, gs[j]), dot_s[j]);
#pragma unroll
      for (int d = 0; d < kD; ++d) {
        dvr[d] += p * gs[j][d];
        dkr[d] += ds * qs[j][d];
      }
    }
  }
  if (!active) return;
  S* ok = dk + base + static_cast<int64_t>(s) * D;
  S* ov = dv + base + static_cast<int64_t>(s) * D;
#pragma unroll
  for (int d = 0; d < kD; ++d)
    if (d < D) {
      ok[d] = from_float<S>(scale * dkr[d]);
      ov[d] = from_float<S>(dvr[d]);
    }
}

#if !defined(HR_WARP_EMULATION)
template <typename S, int kD>
void forward_launch(const Launch& l, const Tensor& q, const Tensor& k, const Tensor& v, const MaskArgs& m,
                    float scale, Tensor& out, Tensor& lse) {
  mem_efficient_forward_kernel<S, kD><<<l.grid, kRows, 0, l.stream>>>(
      q.data_as<S>(), k.data_as<S>(), v.data_as<S>(), m, l.H, l.T, l.D, scale, out.data_as<S>(),
      lse.data_as<float>());
  HR_CUDA_CHECK_LAUNCH();
}

template <typename S, int kD>
void backward_launch(const Launch& l, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& dout,
                     const Tensor& lse, const Tensor& row_dot, const MaskArgs& m, float scale, Tensor& dq, Tensor& dk,
                     Tensor& dv) {
  mem_efficient_dq_kernel<S, kD><<<l.grid, kRows, 0, l.stream>>>(
      q.data_as<S>(), k.data_as<S>(), v.data_as<S>(), dout.data_as<S>(), lse.data_as<float>(),
      row_dot.data_as<float>(), m, l.H, l.T, l.D, scale, dq.data_as<S>());
  HR_CUDA_CHECK_LAUNCH();
  mem_efficient_dkv_kernel<S, kD><<<l.grid, kRows, 0, l.stream>>>(
      q.data_as<S>(), k.data_as<S>(), v.data_as<S>(), dout.data_as<S>(), lse.data_as<float>(),
      row_dot.data_as<float>(), m, l.H, l.T, l.D, scale, dk.data_as<S>(), dv.data_as<S>());
  HR_CUDA_CHECK_LAUNCH();
}
#endif  // !HR_WARP_EMULATION

}  // namespace hr::ops::cuda::attn_kernels

#define HR_ATTENTION_INSTANTIATE_FWD(kD)                                                                         \
  namespace hr::ops::cuda::attn_kernels {                                                                        \
  template void forward_launch<float, kD>(const Launch&, const Tensor&, const Tensor&, const Tensor&,           \
                                          const MaskArgs&, float, Tensor&, Tensor&);                             \
  template void forward_launch<half_t, kD>(const Launch&, const Tensor&, const Tensor&, const Tensor&,          \
                                           const MaskArgs&, float, Tensor&, Tensor&);                            \
  template void forward_launch<bfloat16_t, kD>(const Launch&, const Tensor&, const Tensor&, const Tensor&,      \
                                               const MaskArgs&, float, Tensor&, Tensor&);                        \
  }
#define HR_ATTENTION_INSTANTIATE_BWD(kD)                                                                         \
  namespace hr::ops::cuda::attn_kernels {                                                                        \
  template void backward_launch<float, kD>(const Launch&, const Tensor&, const Tensor&, const Tensor&,          \
                                           const Tensor&, const Tensor&, const Tensor&, const MaskArgs&, float,  \
                                           Tensor&, Tensor&, Tensor&);                                           \
  template void backward_launch<half_t, kD>(const Launch&, const Tensor&, const Tensor&, const Tensor&,         \
                                            const Tensor&, const Tensor&, const Tensor&, const MaskArgs&, float, \
                                            Tensor&, Tensor&, Tensor&);                                          \
  template void backward_launch<bfloat16_t, kD>(const Launch&, const Tensor&, const Tensor&, const Tensor&,     \
                                                const Tensor&, const Tensor&, const Tensor&, const MaskArgs&,    \
                                                float, Tensor&, Tensor&, Tensor&);                               \
  }
