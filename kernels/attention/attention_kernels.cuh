// Memory-efficient attention's kernels on the GPU. Forward: one block per
// (b*h, tile of kRows query rows), one thread per query row (two from head dim 128,
// each with half the head dim); K and V pass through shared memory kChunk keys at a
// time (fp32, zero-padded to the head-dim bucket kD), the online softmax state lives
// in registers. Backward (FlashAttention-2): D_i = rowsum(dO * O), then one kernel
// computes dQ per query tile and another dK, dV per key tile, a row's threads (one at
// head dim 32, kD / 32 from 64) owning it: deterministic, no atomics.
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

// Threads per query row (forward, dQ) or key row (dK, dV). A row's kSplit threads
// are adjacent lanes, and each owns kD / kSplit of the head dim: its rows of Q, dO,
// the accumulators (or K, V and theirs) in registers, where one thread a row held
// them all. At head dim 128 a forward thread held 256 floats and spilled (364/924
// bytes of stores/loads for sm_90), a dK/dV thread 512 (3,068/4,092); split, a
// thread holds at most 128 at every bucket: 64 (head dim 32) or 128 in the forward,
// 96 in dQ, 128 in dK/dV.
template <int kD>
inline constexpr int kForwardSplit = kD >= 128 ? kD / 64 : 1;
template <int kD>
inline constexpr int kBackwardSplit = kD >= 64 ? kD / 32 : 1;
// Threads per block of each kernel (kRows rows).
template <int kD>
constexpr int forward_threads() {
  return kRows * kForwardSplit<kD>;
}
template <int kD>
constexpr int backward_threads() {
  return kRows * kBackwardSplit<kD>;
}

// A thread's share of a row of head dim kD split kSplit ways, in 4-float pieces:
// the thread of part r (0 .. kSplit - 1) holds pieces r, r + kSplit, r + 2 kSplit,
// ..., so the kSplit threads' 16-byte reads of one staged row fall in distinct banks.
template <int kD, int kSplit>
struct Part {
  static_assert(kD % (4 * kSplit) == 0 && 32 % kSplit == 0, "whole pieces, a row's threads in one warp");
  static constexpr int kPieces = kD / (4 * kSplit);
  float4 v[kPieces];

  __device__ void zero() {
#pragma unroll
    for (int i = 0; i < kPieces; ++i) v[i] = make_float4(0.f, 0.f, 0.f, 0.f);
  }
  // The first column of piece i.
  static __device__ int col(int i, int r) { return 4 * (i * kSplit + r); }
  // From a row of D elements in global memory, zero past D or where !active.
  template <typename S>
  __device__ void load(const S* src, bool active, int D, int r) {
#pragma unroll
    for (int i = 0; i < kPieces; ++i) {
      float e[4];
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int d = col(i, r) + c;
        e[c] = (active && d < D) ? to_float(src[d]) : 0.f;
      }
      v[i] = make_float4(e[0], e[1], e[2], e[3]);
    }
  }
  // This thread's part of the dot product with a staged row.
  __device__ float dot(const float4* row, int r) const {
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < kPieces; ++i) {
      const float4 b = row[i * kSplit + r];
      s += v[i].x * b.x + v[i].y * b.y + v[i].z * b.z + v[i].w * b.w;
    }
    return s;
  }
  // += a times this thread's part of a staged row.
  __device__ void add(float a, const float4* row, int r) {
#pragma unroll
    for (int i = 0; i < kPieces; ++i) {
      const float4 b = row[i * kSplit + r];
      v[i].x += a * b.x;
      v[i].y += a * b.y;
      v[i].z += a * b.z;
      v[i].w += a * b.w;
    }
  }
  __device__ void scale(float f) {
#pragma unroll
    for (int i = 0; i < kPieces; ++i) {
      v[i].x *= f;
      v[i].y *= f;
      v[i].z *= f;
      v[i].w *= f;
    }
  }
  // times f into a row of D elements in global memory.
  template <typename S>
  __device__ void store(S* dst, float f, int D, int r) const {
#pragma unroll
    for (int i = 0; i < kPieces; ++i) {
      const float e[4] = {v[i].x, v[i].y, v[i].z, v[i].w};
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int d = col(i, r) + c;
        if (d < D) dst[d] = from_float<S>(e[c] * f);
      }
    }
  }
};

// The sum of x over a row's kSplit threads, by a butterfly of shuffles: each
// thread adds the same two values at each level, so all of them hold the same bits.
// Every lane of the warp must call it.
template <int kSplit>
__device__ __forceinline__ float row_sum(float x) {
#pragma unroll
  for (int o = 1; o < kSplit; o <<= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

// Whether a thread takes a (row, key) pair its row allows or not: where a row has
// several threads they meet in row_sum's shuffles, so the warp takes the pair where
// any of its rows allows it (a vote: uniform across the warp); a row's only thread
// takes its own. Every lane of the warp must call it.
template <int kSplit>
__device__ __forceinline__ bool take_pair(bool allowed) {
  if constexpr (kSplit > 1)
    return __any_sync(0xffffffffu, allowed);
  else
    return allowed;
}

// Rows [r0, r0 + kChunk) of a [T, D] matrix into shared memory as fp32 (4-float
// pieces), zero-padded past T and past D (so dot products over kD need no bounds).
// Where the rows are whole 4-element vectors (D a multiple of 4, the matrix aligned
// to one) a thread reads its piece in one load.
template <typename S, int kD>
__device__ void stage_rows(const S* src, int r0, int T, int D, float4 (*dst)[kD / 4]) {
  struct alignas(4 * sizeof(S)) Four {
    S e[4];
  };
  const bool whole = D % 4 == 0 && reinterpret_cast<uintptr_t>(src) % sizeof(Four) == 0;
  for (int i = threadIdx.x; i < kChunk * (kD / 4); i += blockDim.x) {
    const int r = i / (kD / 4), c = 4 * (i % (kD / 4)), row = r0 + r;
    float e[4] = {0.f, 0.f, 0.f, 0.f};
    if (row < T) {
      const S* from = src + static_cast<int64_t>(row) * D + c;
      if (whole) {
        if (c < D) {
          const Four f = *reinterpret_cast<const Four*>(from);
#pragma unroll
          for (int j = 0; j < 4; ++j) e[j] = to_float(f.e[j]);
        }
      } else {
#pragma unroll
        for (int j = 0; j < 4; ++j)
          if (c + j < D) e[j] = to_float(from[j]);
      }
    }
    dst[r][c / 4] = make_float4(e[0], e[1], e[2], e[3]);
  }
}

// Where the keys that any query row of a batch row up to `last` may see end: a
// causal row sees no key past itself, a batch row none past its length (`rm` is one
// of the rows; its length is the batch row's). For a block's or a warp's rows, with
// `last` its last row below T: uniform across them (segments allow fewer).
__device__ inline int key_end_through(const MaskArgs& mask, const sm::RowMask& rm, int last, int T) {
  return sm::allowed_end(sm::RowMask{mask.causal, last, rm.kv_len, nullptr}, T);
}

// A thread's row in its block's tile, its part of the row, its warp's last row below
// T and whether the warp has one (uniform across the warp).
template <int kSplit>
struct Seat {
  int row, part, warp_last;
  bool warp_live;
  __device__ Seat(int first_row, int T) {
    const int thread = static_cast<int>(threadIdx.x), warp_first = first_row + thread / 32 * 32 / kSplit;
    row = first_row + thread / kSplit;
    part = thread % kSplit;
    warp_last = min(T, warp_first + 32 / kSplit) - 1;
    warp_live = warp_first < T;
  }
};

template <typename S, int kD>
__global__ void __launch_bounds__(forward_threads<kD>())
    mem_efficient_forward_kernel(const S* __restrict__ q, const S* __restrict__ k, const S* __restrict__ v,
                                 MaskArgs mask, int H, int T, int D, float scale, S* __restrict__ out,
                                 float* __restrict__ lse) {
  // Keys per step of the online softmax: each step rescales the row's accumulators
  // once, so a rescale adds 8 products to every 128 of a key. The loops are
  // unrolled and the scores stay in registers. All 32 keys of a chunk in one step
  // took 48 s of nvcc for sm_90 at head dim 64 (8 keys: 10 s) and spilled at 32.
  constexpr int kSplit = kForwardSplit<kD>, kStep = 8;
  static_assert(kChunk % kStep == 0, "a chunk is whole steps");
  HR_SHARED(float4[kChunk][kD / 4], ks);
  HR_SHARED(float4[kChunk][kD / 4], vs);
  const int bh = blockIdx.x, b = bh / H;
  const int t0 = blockIdx.y * kRows;
  const Seat<kSplit> me(t0, T);
  const int t = me.row, r = me.part;
  const bool active = t < T;
  const int64_t base = static_cast<int64_t>(bh) * T * D;
  Part<kD, kSplit> qr, acc;
  qr.load(q + base + static_cast<int64_t>(t) * D, active, D, r);
  acc.zero();
  const sm::RowMask rm = row_mask(mask, b, t, T);
  // No key of this row at or past s_end (segments allow fewer), and none that the
  // rows this thread runs with may see at or past run_end: its row's, or where a
  // row's threads meet in shuffles, the warp's rows' (uniform across the warp).
  const int s_end = active ? sm::allowed_end(rm, T) : 0;
  const int run_end = kSplit > 1 ? key_end_through(mask, rm, me.warp_last, T) : s_end;
  float m = -INFINITY, l = 0.f;
  const int block_end = key_end_through(mask, rm, min(T, t0 + kRows) - 1, T);
  for (int s0 = 0; s0 < block_end; s0 += kChunk) {
    __syncthreads();  // the previous chunk is consumed
    stage_rows<S, kD>(k + base, s0, T, D, ks);
    stage_rows<S, kD>(v + base, s0, T, D, vs);
    __syncthreads();
    if (!me.warp_live) continue;
#pragma unroll 1
    for (int j0 = 0; j0 < kChunk; j0 += kStep) {
      if (s0 + j0 >= run_end) break;  // the rows' last keys are behind
      float sc[kStep];
      uint32_t ok = 0;
      float step_max = -INFINITY;
#pragma unroll
      for (int j = 0; j < kStep; ++j) {
        const int s = s0 + j0 + j;
        const bool allowed = s < s_end && sm::allowed(rm, s);
        sc[j] = 0.f;
        if (take_pair<kSplit>(allowed)) sc[j] = scale * row_sum<kSplit>(qr.dot(ks[j0 + j], r));
        if (allowed) {
          ok |= 1u << j;
          step_max = fmaxf(step_max, sc[j]);
        }
      }
      const float factor = attn::online_rescale(m, l, step_max);
      if (ok == 0) continue;
      acc.scale(factor);
#pragma unroll
      for (int j = 0; j < kStep; ++j) {
        if (!(ok & (1u << j))) continue;
        const float p = attn::online_weight(sc[j], m);
        l += p;
        acc.add(p, vs[j0 + j], r);
      }
    }
  }
  if (!active) return;
  acc.store(out + base + static_cast<int64_t>(t) * D, attn::inv_row_sum(l), D, r);
  if (r == 0) lse[static_cast<int64_t>(bh) * T + t] = attn::row_lse(m, l);
}

// Keys (queries) of a chunk per pass of the backward kernels' loops: four keys' dot
// products overlap. Each thread holds 96 (dQ) or 128 (dK/dV) floats at every bucket.
constexpr int kBackwardUnroll = 4;

template <typename S, int kD>
__global__ void __launch_bounds__(backward_threads<kD>())
    mem_efficient_dq_kernel(const S* __restrict__ q, const S* __restrict__ k, const S* __restrict__ v,
                            const S* __restrict__ dout, const float* __restrict__ lse,
                            const float* __restrict__ row_dot, MaskArgs mask, int H, int T, int D, float scale,
                            S* __restrict__ dq) {
  constexpr int kSplit = kBackwardSplit<kD>;
  HR_SHARED(float4[kChunk][kD / 4], ks);
  HR_SHARED(float4[kChunk][kD / 4], vs);
  const int bh = blockIdx.x, b = bh / H;
  const int t0 = blockIdx.y * kRows;
  const Seat<kSplit> me(t0, T);
  const int t = me.row, r = me.part;
  const bool active = t < T;
  const int64_t base = static_cast<int64_t>(bh) * T * D;
  Part<kD, kSplit> qr, gr, dqr;
  qr.load(q + base + static_cast<int64_t>(t) * D, active, D, r);
  gr.load(dout + base + static_cast<int64_t>(t) * D, active, D, r);
  dqr.zero();
  const sm::RowMask rm = row_mask(mask, b, t, T);
  const float lse_t = active ? lse[static_cast<int64_t>(bh) * T + t] : 0.f;
  const float dot_t = active ? row_dot[static_cast<int64_t>(bh) * T + t] : 0.f;
  const int s_end = active ? sm::allowed_end(rm, T) : 0;  // as in the forward
  const int run_end = kSplit > 1 ? key_end_through(mask, rm, me.warp_last, T) : s_end;
  const int block_end = key_end_through(mask, rm, min(T, t0 + kRows) - 1, T);
  for (int s0 = 0; s0 < block_end; s0 += kChunk) {
    __syncthreads();
    stage_rows<S, kD>(k + base, s0, T, D, ks);
    stage_rows<S, kD>(v + base, s0, T, D, vs);
    __syncthreads();
    if (!me.warp_live) continue;
#pragma unroll kBackwardUnroll
    for (int j = 0; j < kChunk; ++j) {
      const int s = s0 + j;
      if (s >= run_end) break;
      const bool allowed = s < s_end && sm::allowed(rm, s);
      if (!take_pair<kSplit>(allowed)) continue;
      const float sc = row_sum<kSplit>(qr.dot(ks[j], r)), dp = row_sum<kSplit>(gr.dot(vs[j], r));
      if (!allowed) continue;
      const float ds = attn::dscore_unscaled(attn::prob_from_lse(scale * sc, lse_t), dp, dot_t);
      dqr.add(ds, ks[j], r);
    }
  }
  if (!active) return;
  dqr.store(dq + base + static_cast<int64_t>(t) * D, scale, D, r);
}

template <typename S, int kD>
__global__ void __launch_bounds__(backward_threads<kD>())
    mem_efficient_dkv_kernel(const S* __restrict__ q, const S* __restrict__ k, const S* __restrict__ v,
                             const S* __restrict__ dout, const float* __restrict__ lse,
                             const float* __restrict__ row_dot, MaskArgs mask, int H, int T, int D, float scale,
                             S* __restrict__ dk, S* __restrict__ dv) {
  constexpr int kSplit = kBackwardSplit<kD>;
  HR_SHARED(float4[kChunk][kD / 4], qs);
  HR_SHARED(float4[kChunk][kD / 4], gs);
  HR_SHARED(float[kChunk], lse_s);
  HR_SHARED(float[kChunk], dot_s);
  const int bh = blockIdx.x, b = bh / H;
  const int s_first = blockIdx.y * kRows;
  const Seat<kSplit> me(s_first, T);
  const int s = me.row, r = me.part;
  const bool active = s < T;
  const int64_t base = static_cast<int64_t>(bh) * T * D;
  Part<kD, kSplit> kr, vr, dkr, dvr;
  kr.load(k + base + static_cast<int64_t>(s) * D, active, D, r);
  vr.load(v + base + static_cast<int64_t>(s) * D, active, D, r);
  dkr.zero();
  dvr.zero();
  // Causal: queries before this block's first key see none of its keys. Keys at or
  // past the batch row's length are seen by no query: a block of them stores zeros.
  const bool seen = mask.kv_len == nullptr || s_first < mask.kv_len[b];
  const int t_begin = !seen ? T : mask.causal ? (s_first / kChunk) * kChunk : 0;
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
    if (!me.warp_live) continue;
#pragma unroll kBackwardUnroll
    for (int j = 0; j < kChunk; ++j) {
      const int t = t0 + j;
      if (t >= T) break;  // uniform across the block
      const bool allowed = active && sm::allowed(row_mask(mask, b, t, T), s);
      if (!take_pair<kSplit>(allowed)) continue;
      const float sc = row_sum<kSplit>(kr.dot(qs[j], r)), dp = row_sum<kSplit>(vr.dot(gs[j], r));
      if (!allowed) continue;
      const float p = attn::prob_from_lse(scale * sc, lse_s[j]);
      const float ds = attn::dscore_unscaled(p, dp, dot_s[j]);
      dvr.add(p, gs[j], r);
      dkr.add(ds, qs[j], r);
    }
  }
  if (!active) return;
  dkr.store(dk + base + static_cast<int64_t>(s) * D, scale, D, r);
  dvr.store(dv + base + static_cast<int64_t>(s) * D, 1.f, D, r);
}

#if !defined(HR_WARP_EMULATION)
template <typename S, int kD>
void forward_launch(const Launch& l, const Tensor& q, const Tensor& k, const Tensor& v, const MaskArgs& m,
                    float scale, Tensor& out, Tensor& lse) {
  mem_efficient_forward_kernel<S, kD><<<l.grid, forward_threads<kD>(), 0, l.stream>>>(
      q.data_as<S>(), k.data_as<S>(), v.data_as<S>(), m, l.H, l.T, l.D, scale, out.data_as<S>(),
      lse.data_as<float>());
  HR_CUDA_CHECK_LAUNCH();
}

template <typename S, int kD>
void backward_launch(const Launch& l, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& dout,
                     const Tensor& lse, const Tensor& row_dot, const MaskArgs& m, float scale, Tensor& dq, Tensor& dk,
                     Tensor& dv) {
  mem_efficient_dq_kernel<S, kD><<<l.grid, backward_threads<kD>(), 0, l.stream>>>(
      q.data_as<S>(), k.data_as<S>(), v.data_as<S>(), dout.data_as<S>(), lse.data_as<float>(),
      row_dot.data_as<float>(), m, l.H, l.T, l.D, scale, dq.data_as<S>());
  HR_CUDA_CHECK_LAUNCH();
  mem_efficient_dkv_kernel<S, kD><<<l.grid, backward_threads<kD>(), 0, l.stream>>>(
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
