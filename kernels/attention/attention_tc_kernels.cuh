// Memory-efficient attention on tensor cores, fp16 and bf16 (sm_80 and newer).
// One block of four warps takes a tile of 64 query rows (forward, dQ) or 64 keys
// (dK, dV); each warp owns 16 of them. The products (Q K^T, P V, dO V^T, dS K, ...)
// run as 16x16x16 WMMA tiles with fp32 accumulation from shared memory; the
// softmax's row statistics are kept by two lanes per row, each over half of the
// 64 columns of a step. P and dS are rounded to the storage format before their
// product, as FlashAttention-2 does (dS in fp16 times a power of two that keeps it
// in range, ds_prescale); every sum stays fp32. Every accumulator (the forward
// output too) stays in registers: the forward rescales its output per row through
// the accumulator's element-to-row map, which WMMA leaves unspecified and each warp
// reads once (accumulator_rows). Tiles load by cp.async into one buffer per operand,
// each step's next operand loading while the current one is used. Deterministic: no
// atomics. Include only from the per-head-dim translation units (attention_tc_d*.cu).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_pipeline_primitives.h>
#include <mma.h>

#include <cstdint>
#include <type_traits>

#include "harness/cuda_check.cuh"
#include "kernels/common/cuda_launch.cuh"
#include "kernels/attention/attention_launch.hpp"
#include "kernels/attention/attention_mask.cuh"
#include "kernels/attention/attention_math.hpp"
#include "kernels/common/float16.hpp"
#include "kernels/softmax/softmax_math.hpp"

namespace hr::ops::cuda::attn_tc {

namespace wmma = nvcuda::wmma;
using attn_kernels::Launch;
using attn_kernels::MaskArgs;
// The backward kernels stage their fp32 results through the warp's two score buffers.
static_assert(out_bytes<kMaxTcHeadDim>() <= 2 * kScoreBytes, "backward output staging exceeds the score buffers");

// The CUDA type WMMA takes for each storage format (same bits).
template <typename S>
struct MmaType;
template <>
struct MmaType<half_t> {
  using T = __half;
  static __device__ T from(float f) { return __float2half_rn(f); }
};
template <>
struct MmaType<bfloat16_t> {
  using T = __nv_bfloat16;
  static __device__ T from(float f) { return __float2bfloat16_rn(f); }
};

using attn_kernels::row_mask;

// This lane's half of one output row: dst[d] = factor * row[d] for d < D (where the
// rows are not whole 16-byte vectors; store_rows otherwise).
template <typename S, int kD>
__device__ void store_half_row(S* __restrict__ dst, const float* row, float factor, int half, int D) {
  for (int d = half * (kD / 2); d < (half + 1) * (kD / 2) && d < D; ++d) dst[d] = from_float<S>(factor * row[d]);
}

// The warp's 16 output rows from its fp32 stage ([16][kLdOut]) into dst, the first
// of them, at D elements a row: row i times the `factor` of lane 2i, rows from
// `rows` on left alone. Where the rows are whole 16-byte vectors (D a multiple of 8,
// dst aligned), each lane stores 16-byte vectors of 8 elements, so a warp writes
// whole rows at once; otherwise each lane pair its row, element by element. Every
// lane of the warp must call it.
template <typename S, int kD>
__device__ void store_rows(S* __restrict__ dst, const float* stage, float factor, int rows, int D, int lane) {
  static_assert(sizeof(S) == 2, "16-bit outputs");
  if (D % 8 == 0 && reinterpret_cast<uintptr_t>(dst) % 16 == 0) {
    constexpr int kVecs = kD / 8;  // per row
    static_assert(16 * kVecs % 32 == 0, "whole warp passes");
#pragma unroll
    for (int i = lane; i < 16 * kVecs; i += 32) {
      const int row = i / kVecs, c = (i % kVecs) * 8;
      const float f = __shfl_sync(0xffffffffu, factor, 2 * row);
      if (row >= rows || c >= D) continue;
      // Two 16-byte reads of the stage (its rows are kLdOut = kD + 4 floats: 16-byte aligned).
      const float4* src = reinterpret_cast<const float4*>(stage + row * kLdOut<kD> + c);
      const float4 lo = src[0], hi = src[1];
      const float x[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
      uint32_t w[4];
#pragma unroll
      for (int k = 0; k < 4; ++k)
        w[k] = static_cast<uint32_t>(from_float<S>(f * x[2 * k]).bits) |
               (static_cast<uint32_t>(from_float<S>(f * x[2 * k + 1]).bits) << 16);
      *reinterpret_cast<uint4*>(dst + static_cast<int64_t>(row) * D + c) = make_uint4(w[0], w[1], w[2], w[3]);
    }
  } else if ((lane >> 1) < rows) {
    store_half_row<S, kD>(dst + static_cast<int64_t>(lane >> 1) * D, stage + (lane >> 1) * kLdOut<kD>, factor,
                          lane & 1, D);
  }
}

// The column a lane takes at step c of its loops over its half of a row (32 columns,
// or kD / 2 output columns). Lane 2r + h reads row r, half h; the rows are 68 floats
// (or 72 halves, or kD + 4 floats) apart and the halves 32 columns, so in step
// order every lane pair, and rows r and r + 8, would meet in one bank (4-way). A
// lane starts (r / 8) + 2h columns in instead: the fp32 rows are then conflict-free
// and the 16-bit ones 2-way. The sums over a row's columns change order, nothing else.
__device__ __forceinline__ int lane_column(int c, int lane, int n) {
  return (c + ((lane >> 1) >> 3) + 2 * (lane & 1)) & (n - 1);
}

// The query tile of this block. The grid runs y by y, so under a causal mask the
// last tiles, which see the most keys, go first and the one-step tiles fill the
// tail, not the other way round (blocks are otherwise the same work).
__device__ __forceinline__ int query_tile(const MaskArgs& mask) {
  return mask.causal ? static_cast<int>(gridDim.y - 1 - blockIdx.y) : static_cast<int>(blockIdx.y);
}

// Rows [r0, r0 + kTile) of a [T, D] matrix into dst [kTile][kLdIn], zero past T
// and past D, so every product runs over whole 16x16 tiles. Where the rows allow
// 16-byte copies (D a multiple of 8, the matrix 16-byte aligned) they are cp.async
// copies that run on while the block computes: the caller commits them as a group
// and waits for it (landed) before the tile is read. Otherwise plain copies, which
// the same wait and barrier make visible.
template <typename M, int kD>
__device__ void stage_tile(const M* __restrict__ src, int r0, int T, int D, M* __restrict__ dst) {
  const uint16_t* s16 = reinterpret_cast<const uint16_t*>(src);
  uint16_t* d16 = reinterpret_cast<uint16_t*>(dst);
  if (D % 8 == 0 && reinterpret_cast<uintptr_t>(src) % 16 == 0) {
    constexpr int kVecs = kD / 8;
    for (int i = threadIdx.x; i < kTile * kVecs; i += blockDim.x) {
      const int r = i / kVecs, c = (i % kVecs) * 8, row = r0 + r;
      uint16_t* to = d16 + r * kLdIn<kD> + c;
      if (row < T && c < D)
        __pipeline_memcpy_async(to, s16 + static_cast<int64_t>(row) * D + c, 16);
      else
        *reinterpret_cast<uint4*>(to) = make_uint4(0u, 0u, 0u, 0u);
    }
  } else {
    for (int i = threadIdx.x; i < kTile * kD; i += blockDim.x) {
      const int r = i / kD, c = i % kD, row = r0 + r;
      d16[r * kLdIn<kD> + c] = (row < T && c < D) ? s16[static_cast<int64_t>(row) * D + c] : uint16_t{0};
    }
  }
}

// Entries [t0, t0 + kTile) of a row of T floats into dst, zero past T (cp.async,
// like stage_tile).
__device__ inline void stage_floats(const float* __restrict__ src, int t0, int T, float* __restrict__ dst) {
  for (int i = threadIdx.x; i < kTile; i += blockDim.x) {
    if (t0 + i < T)
      __pipeline_memcpy_async(dst + i, src + t0 + i, 4);
    else
      dst[i] = 0.f;
  }
}

// Every copy this thread has issued is done, and after the barrier every thread's
// is visible; every warp has also finished what it read before the call.
__device__ __forceinline__ void landed() {
  __pipeline_wait_prior(0);
  __syncthreads();
}

using Acc = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;
constexpr int kAccElems = Acc::num_elements;

// The row of a 16x16 accumulator tile that each of this lane's elements holds,
// packed 4 bits an element (rows 0-15; one register, not kAccElems). WMMA leaves
// the element-to-row map unspecified, but it is one map for every fragment of the
// type (loads, stores and products agree on it), so a warp reads it once by loading
// a tile whose every element is its row index. scratch: the warp's 16 x ld floats,
// free before and after. acc_row(rows, i) unpacks element i's row.
static_assert(kAccElems <= 8, "4 bits an element in 32");
__device__ __forceinline__ uint32_t accumulator_rows(float* scratch, int ld, int lane) {
  for (int i = lane; i < 16 * 16; i += 32) scratch[(i / 16) * ld + i % 16] = static_cast<float>(i / 16);
  __syncwarp();
  Acc f;
  wmma::load_matrix_sync(f, scratch, ld, wmma::mem_row_major);
  uint32_t rows = 0;
#pragma unroll
  for (int i = 0; i < kAccElems; ++i) rows |= static_cast<uint32_t>(f.x[i]) << (4 * i);
  __syncwarp();
  return rows;
}
__device__ __forceinline__ int acc_row(uint32_t rows, int i) { return static_cast<int>((rows >> (4 * i)) & 15u); }

// The softmax in base 2, as FlashAttention-2 computes it: a scaled score s * scale
// is s * scale2 in units of log2(e) (scale2 = scale * log2(e)), so each weight is
// one exp2f of one fma, where expf takes a range reduction of several instructions
// per element. The row's maximum m2 and the saved statistics convert at the ends:
// the log-sum-exp kept for the backward is the natural-log one the other kernels
// save (m2 ln 2 + ln l), and the backward's lse2 = lse * log2(e).
constexpr float kLog2e = 1.4426950408889634f, kLn2 = 0.6931471805599453f;

// 2^x: attn::online_rescale's exponential for a maximum kept in base 2.
struct Exp2 {
  __device__ float operator()(float x) const { return exp2f(x); }
};

// exp(s * scale - shift) for a raw score s, with scale2 = scale * log2(e) and
// shift2 = shift * log2(e): a forward's weight under its running maximum, or a
// backward's probability from the saved log-sum-exp.
__device__ __forceinline__ float exp_scaled2(float s, float scale2, float shift2) {
  return exp2f(fmaf(s, scale2, -shift2));
}

// out[16][kTile] (fp32, ld kLdScore) = A[16][kD] * B[kTile][kD]^T, A and B row-major
// 16-bit tiles with stride kLdIn: the scores of a warp's 16 rows against a step's keys.
template <typename M, int kD>
__device__ void product_abt(const M* a, const M* b, float* out) {
#pragma unroll
  for (int j = 0; j < kTile / 16; ++j) {
    Acc acc;
    wmma::fill_fragment(acc, 0.f);
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, M, wmma::row_major> fa;
      wmma::fragment<wmma::matrix_b, 16, 16, 16, M, wmma::col_major> fb;
      wmma::load_matrix_sync(fa, a + kk * 16, kLdIn<kD>);
      wmma::load_matrix_sync(fb, b + j * 16 * kLdIn<kD> + kk * 16, kLdIn<kD>);
      wmma::mma_sync(acc, fa, fb, acc);
    }
    wmma::store_matrix_sync(out + j * 16, acc, kLdScore, wmma::mem_row_major);
  }
}

// acc[j] += P[16][kTile] (16-bit, ld kLdProb) * B[kTile][kD] (ld kLdIn), column tile j.
template <typename M, int kD>
__device__ void accumulate_pb(Acc (&acc)[kD / 16], const M* p, const M* b) {
#pragma unroll
  for (int j = 0; j < kD / 16; ++j)
#pragma unroll
    for (int kk = 0; kk < kTile / 16; ++kk) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, M, wmma::row_major> fa;
      wmma::fragment<wmma::matrix_b, 16, 16, 16, M, wmma::row_major> fb;
      wmma::load_matrix_sync(fa, p + kk * 16, kLdProb);
      wmma::load_matrix_sync(fb, b + kk * 16 * kLdIn<kD> + j * 16, kLdIn<kD>);
      wmma::mma_sync(acc[j], fa, fb, acc[j]);
    }
}

template <typename S, int kD>
__global__ void __launch_bounds__(kThreads, design_blocks(forward_smem_bytes<kD>()))
    tc_forward_kernel(const S* __restrict__ q, const S* __restrict__ k, const S* __restrict__ v, MaskArgs mask, int H,
                      int T, int D, float scale, S* __restrict__ out, float* __restrict__ lse) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  using M = typename MmaType<S>::T;
  extern __shared__ __align__(128) unsigned char smem[];
  M* qs = reinterpret_cast<M*>(smem);
  M* ks = qs + kTile * kLdIn<kD>;
  M* vs = ks + kTile * kLdIn<kD>;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float* s_w = reinterpret_cast<float*>(vs + kTile * kLdIn<kD>) + warp * 16 * kLdScore;
  M* p_w = reinterpret_cast<M*>(reinterpret_cast<float*>(vs + kTile * kLdIn<kD>) + kWarps * 16 * kLdScore) +
           warp * 16 * kLdProb;

  static_assert(kWarps * out_bytes<kD>() <= 2 * in_tile_bytes<kD>(), "output staging exceeds the K and V tiles");

  const int bh = blockIdx.x, b = bh / H;
  const int t0 = query_tile(mask) * kTile, w0 = t0 + warp * 16;  // the block's and the warp's first row
  const int64_t base = static_cast<int64_t>(bh) * T * D;
  const M* km = reinterpret_cast<const M*>(k) + base;
  const M* vm = reinterpret_cast<const M*>(v) + base;
  const int r = lane >> 1, half = lane & 1;  // this lane's row of the warp, and its half of the columns
  const int t = w0 + r;
  const bool active = t < T;
  const sm::RowMask rm = active ? row_mask(mask, b, t, T) : sm::RowMask{false, 0, 0, nullptr};
  stage_tile<M, kD>(reinterpret_cast<const M*>(q) + base, t0, T, D, qs);
  stage_tile<M, kD>(km, 0, T, D, ks);
  __pipeline_commit();
  const uint32_t rows = accumulator_rows(s_w, kLdScore, lane);  // each accumulator element's output row
  Acc o[kD / 16];  // the unnormalised output, 16 columns a fragment
#pragma unroll
  for (int j = 0; j < kD / 16; ++j) wmma::fill_fragment(o[j], 0.f);
  float m2 = -INFINITY, l = 0.f;  // the row's running maximum in base 2 (kLog2e), and sum
  const float scale2 = scale * kLog2e;
  const int w_last = min(T, w0 + 16) - 1;
  // A causal block sees no key past its last row.
  const int s_end = mask.causal ? min(T, t0 + kTile) : T;
  // Each step: K is in place; V loads while the scores and P are made, and the next
  // K while P V runs.
  for (int s0 = 0; s0 < s_end; s0 += kTile) {
    landed();  // K of this step; every warp is done with the last step's V
    stage_tile<M, kD>(vm, s0, T, D, vs);
    __pipeline_commit();
    const bool live = w0 < T && !(mask.causal && s0 > w_last);  // uniform across the warp
    if (live) {
      product_abt<M, kD>(qs + warp * 16 * kLdIn<kD>, ks, s_w);
      __syncwarp();
      const float* srow = s_w + r * kLdScore + half * 32;
      uint32_t ok = 0;
      float chunk_max = -INFINITY;
#pragma unroll
      for (int i = 0; i < 32; ++i) {
        const int c = lane_column(i, lane, 32), s = s0 + half * 32 + c;
        if (active && s < T && sm::allowed(rm, s)) {
          ok |= 1u << c;
          chunk_max = fmaxf(chunk_max, scale2 * srow[c]);
        }
      }
      chunk_max = fmaxf(chunk_max, __shfl_xor_sync(0xffffffffu, chunk_max, 1));
      const float factor = attn::online_rescale(m2, l, chunk_max, Exp2{});  // the pair computes it alike
      M* prow = p_w + r * kLdProb + half * 32;
      float sum = 0.f;
#pragma unroll
      for (int i = 0; i < 32; ++i) {
        const int c = lane_column(i, lane, 32);
        const float p = (ok & (1u << c)) ? exp_scaled2(srow[c], scale2, m2) : 0.f;
        sum += p;
        prow[c] = MmaType<S>::from(p);
      }
      l += sum + __shfl_xor_sync(0xffffffffu, sum, 1);
      // Each output element takes its row's factor, from the lane pair that owns the
      // row; most steps past the first leave every row's maximum, and skip this.
      if (__any_sync(0xffffffffu, factor != 1.f)) {
#pragma unroll
        for (int i = 0; i < kAccElems; ++i) {
          const float f = __shfl_sync(0xffffffffu, factor, 2 * acc_row(rows, i));
#pragma unroll
          for (int j = 0; j < kD / 16; ++j) o[j].x[i] *= f;
        }
      }
      __syncwarp();
    }
    landed();  // V of this step; every warp is done with its K
    if (s0 + kTile < s_end) {
      stage_tile<M, kD>(km, s0 + kTile, T, D, ks);
      __pipeline_commit();
    }
    if (live) accumulate_pb<M, kD>(o, p_w, vs);
  }
  __syncthreads();  // every warp is done with K and V: their tiles stage the outputs
  if (w0 >= T) return;  // uniform across the warp
  float* stage = reinterpret_cast<float*>(ks) + warp * 16 * kLdOut<kD>;
#pragma unroll
  for (int j = 0; j < kD / 16; ++j) wmma::store_matrix_sync(stage + j * 16, o[j], kLdOut<kD>, wmma::mem_row_major);
  __syncwarp();
  store_rows<S, kD>(out + base + static_cast<int64_t>(w0) * D, stage, active ? attn::inv_row_sum(l) : 0.f,
                    min(16, T - w0), D, lane);
  if (active && half == 0) lse[static_cast<int64_t>(bh) * T + t] = attn::row_lse(m2 * kLn2, l);
#else
  __trap();  // the dispatcher selects these kernels only on sm_80 and newer
#endif
}

// fp16 ends at 65504, and at large loss scales a step's dS can pass it where the
// scalar kernels, which keep dS in fp32, stay finite. In fp16 a warp rounds its dS
// times 2^-e, with e >= 0 the smallest that has put every step's largest |dS| below
// 2^14 so far: when a step needs a larger e, the accumulator it feeds is scaled down
// by the difference, and the result is scaled up by 2^e when stored (all exact:
// powers of two). bf16 has fp32's range and keeps e = 0. Returns 2^-e.
template <typename S, int kD>
__device__ float ds_prescale(float max_abs, int& e,
                             Acc (&acc)[kD / 16]) {
  if constexpr (!std::is_same_v<S, half_t>) {
    return 1.f;
  } else {
#pragma unroll
    for (int d = 16; d > 0; d >>= 1) max_abs = fmaxf(max_abs, __shfl_xor_sync(0xffffffffu, max_abs, d));
    if (max_abs >= 0x1p14f && max_abs <= 3.4e38f) {  // finite: an inf or NaN is left to show
      const int need = ilogbf(max_abs) - 13;           // max_abs * 2^-need < 2^14
      if (need > e) {
        const float down = ldexpf(1.f, e - need);
#pragma unroll
        for (int j = 0; j < kD / 16; ++j)
          for (int i = 0; i < acc[j].num_elements; ++i) acc[j].x[i] *= down;
        e = need;
      }
    }
    return ldexpf(1.f, -e);
  }
}

// dQ per tile of 64 query rows: for each step of 64 keys, S = Q K^T and
// dP = dO V^T, then dS = P (dP - D_i) rounded to 16 bits, dQ += dS K.
template <typename S, int kD>
__global__ void __launch_bounds__(kThreads, design_blocks(dq_smem_bytes<kD>()))
    tc_dq_kernel(const S* __restrict__ q, const S* __restrict__ k, const S* __restrict__ v,
                 const S* __restrict__ dout, const float* __restrict__ lse, const float* __restrict__ row_dot,
                 MaskArgs mask, int H, int T, int D, float scale, S* __restrict__ dq) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  using M = typename MmaType<S>::T;
  extern __shared__ __align__(128) unsigned char smem[];
  M* qs = reinterpret_cast<M*>(smem);
  M* gs = qs + kTile * kLdIn<kD>;
  M* ks = gs + kTile * kLdIn<kD>;
  M* vs = ks + kTile * kLdIn<kD>;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float* s_w = reinterpret_cast<float*>(vs + kTile * kLdIn<kD>) + warp * 2 * 16 * kLdScore;
  float* dp_w = s_w + 16 * kLdScore;
  M* ds_w = reinterpret_cast<M*>(s_w);  // the 16-bit dS takes the scores' place once they are read

  const int bh = blockIdx.x, b = bh / H;
  const int t0 = query_tile(mask) * kTile, w0 = t0 + warp * 16;
  const int64_t base = static_cast<int64_t>(bh) * T * D;
  const M* km = reinterpret_cast<const M*>(k) + base;
  const M* vm = reinterpret_cast<const M*>(v) + base;
  const int r = lane >> 1, half = lane & 1;
  const int t = w0 + r;
  const bool active = t < T;
  const sm::RowMask rm = active ? row_mask(mask, b, t, T) : sm::RowMask{false, 0, 0, nullptr};
  const float lse2_t = active ? lse[static_cast<int64_t>(bh) * T + t] * kLog2e : 0.f;
  const float scale2 = scale * kLog2e;
  const float dot_t = active ? row_dot[static_cast<int64_t>(bh) * T + t] : 0.f;
  stage_tile<M, kD>(reinterpret_cast<const M*>(q) + base, t0, T, D, qs);
  stage_tile<M, kD>(reinterpret_cast<const M*>(dout) + base, t0, T, D, gs);
  stage_tile<M, kD>(vm, 0, T, D, vs);
  __pipeline_commit();
  Acc acc[kD / 16];
#pragma unroll
  for (int j = 0; j < kD / 16; ++j) wmma::fill_fragment(acc[j], 0.f);
  int ds_exp = 0;  // dS is rounded times 2^-ds_exp (ds_prescale)
  const int w_last = min(T, w0 + 16) - 1;
  const int s_end = mask.causal ? min(T, t0 + kTile) : T;
  // Each step: V is in place; K loads while dP = dO V^T runs, and the next V while
  // the scores, dS and dS K run.
  for (int s0 = 0; s0 < s_end; s0 += kTile) {
    landed();  // V of this step; every warp is done with the last step's K
    stage_tile<M, kD>(km, s0, T, D, ks);
    __pipeline_commit();
    const bool live = w0 < T && !(mask.causal && s0 > w_last);  // uniform across the warp
    if (live) product_abt<M, kD>(gs + warp * 16 * kLdIn<kD>, vs, dp_w);
    landed();  // K of this step; every warp is done with its V
    if (s0 + kTile < s_end) {
      stage_tile<M, kD>(vm, s0 + kTile, T, D, vs);
      __pipeline_commit();
    }
    if (!live) continue;
    product_abt<M, kD>(qs + warp * 16 * kLdIn<kD>, ks, s_w);
    __syncwarp();
    const float* srow = s_w + r * kLdScore + half * 32;
    float* dprow = dp_w + r * kLdScore + half * 32;  // dP, then this step's dS in fp32
    M* dsrow = ds_w + r * kLdProb + half * 32;
    float ds_max = 0.f;
#pragma unroll
    for (int i = 0; i < 32; ++i) {
      const int c = lane_column(i, lane, 32), s = s0 + half * 32 + c;
      float ds = 0.f;
      if (active && s < T && sm::allowed(rm, s))
        ds = attn::dscore_unscaled(exp_scaled2(srow[c], scale2, lse2_t), dprow[c], dot_t);
      dprow[c] = ds;
      ds_max = fmaxf(ds_max, fabsf(ds));
    }
    const float ds_factor = ds_prescale<S, kD>(ds_max, ds_exp, acc);
    __syncwarp();  // every lane has read its scores: dS overwrites them
#pragma unroll
    for (int i = 0; i < 32; ++i) {
      const int c = lane_column(i, lane, 32);
      dsrow[c] = MmaType<S>::from(dprow[c] * ds_factor);
    }
    __syncwarp();
    accumulate_pb<M, kD>(acc, ds_w, ks);
  }
  __syncwarp();
  if (w0 >= T) return;
  float* stage = s_w;  // [16][kLdOut] fits the warp's two score buffers
#pragma unroll
  for (int j = 0; j < kD / 16; ++j) wmma::store_matrix_sync(stage + j * 16, acc[j], kLdOut<kD>, wmma::mem_row_major);
  __syncwarp();
  store_rows<S, kD>(dq + base + static_cast<int64_t>(w0) * D, stage, ldexpf(scale, ds_exp), min(16, T - w0), D, lane);
#else
  __trap();
#endif
}

// dK, dV per tile of 64 keys: for each step of 64 queries, S^T = K Q^T and
// dP^T = V dO^T, P^T from the saved log-sum-exp, dS^T = P^T (dP^T - D);
// dK += dS^T Q and dV += P^T dO.
template <typename S, int kD>
__global__ void __launch_bounds__(kThreads, design_blocks(dkv_smem_bytes<kD>()))
    tc_dkv_kernel(const S* __restrict__ q, const S* __restrict__ k, const S* __restrict__ v,
                  const S* __restrict__ dout, const float* __restrict__ lse, const float* __restrict__ row_dot,
                  MaskArgs mask, int H, int T, int D, float scale, S* __restrict__ dk, S* __restrict__ dv) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  using M = typename MmaType<S>::T;
  extern __shared__ __align__(128) unsigned char smem[];
  M* ks = reinterpret_cast<M*>(smem);
  M* vs = ks + kTile * kLdIn<kD>;
  M* qs = vs + kTile * kLdIn<kD>;
  M* gs = qs + kTile * kLdIn<kD>;
  float* lse_s = reinterpret_cast<float*>(gs + kTile * kLdIn<kD>);
  float* dot_s = lse_s + kTile;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float* st_w = dot_s + kTile + warp * 2 * 16 * kLdScore;
  float* dpt_w = st_w + 16 * kLdScore;
  M* pt_w = reinterpret_cast<M*>(dot_s + kTile + kWarps * 2 * 16 * kLdScore) + warp * 16 * kLdProb;
  M* dst_w = reinterpret_cast<M*>(st_w);  // the 16-bit dS^T takes the scores' place once they are read

  const int bh = blockIdx.x, b = bh / H;
  // Causal: key tile 0 sees every query, the heaviest first already (query_tile).
  const int s_first = blockIdx.y * kTile, w0 = s_first + warp * 16;
  const int64_t base = static_cast<int64_t>(bh) * T * D;
  const M* qm = reinterpret_cast<const M*>(q) + base;
  const M* gm = reinterpret_cast<const M*>(dout) + base;
  const float* lse_bh = lse + static_cast<int64_t>(bh) * T;
  const float* dot_bh = row_dot + static_cast<int64_t>(bh) * T;
  const int r = lane >> 1, half = lane & 1;  // this lane's key of the warp, and its half of the queries
  const int s = w0 + r;
  const bool active = s < T;
  const bool live = w0 < T;  // uniform across the warp
  // Causal: queries before the block's first key see none of its keys.
  const int t_begin = mask.causal ? s_first : 0;
  const float scale2 = scale * kLog2e;
  stage_tile<M, kD>(reinterpret_cast<const M*>(k) + base, s_first, T, D, ks);
  stage_tile<M, kD>(reinterpret_cast<const M*>(v) + base, s_first, T, D, vs);
  stage_tile<M, kD>(qm, t_begin, T, D, qs);
  stage_floats(lse_bh, t_begin, T, lse_s);
  stage_floats(dot_bh, t_begin, T, dot_s);
  __pipeline_commit();
  Acc acc_dk[kD / 16], acc_dv[kD / 16];
#pragma unroll
  for (int j = 0; j < kD / 16; ++j) {
    wmma::fill_fragment(acc_dk[j], 0.f);
    wmma::fill_fragment(acc_dv[j], 0.f);
  }
  int ds_exp = 0;  // dS^T is rounded times 2^-ds_exp (ds_prescale)
  // Each step: Q and its rows' statistics are in place; dO loads while S^T = K Q^T
  // runs, and the next Q while dV += P^T dO runs.
  for (int t0 = t_begin; t0 < T; t0 += kTile) {
    landed();  // Q, lse and D of this step; every warp is done with the last step's dO
    stage_tile<M, kD>(gm, t0, T, D, gs);
    __pipeline_commit();
    if (live) product_abt<M, kD>(ks + warp * 16 * kLdIn<kD>, qs, st_w);
    landed();  // dO of this step
    if (live) {
      product_abt<M, kD>(vs + warp * 16 * kLdIn<kD>, gs, dpt_w);
      __syncwarp();
      const float* strow = st_w + r * kLdScore + half * 32;
      float* dptrow = dpt_w + r * kLdScore + half * 32;  // dP^T, then this step's dS^T in fp32
      M* prow = pt_w + r * kLdProb + half * 32;
      M* dsrow = dst_w + r * kLdProb + half * 32;
      float ds_max = 0.f;
#pragma unroll 2  // fuller unrolling spills 32 bytes in bf16 (ptxas, sm_90)
      for (int j = 0; j < 32; ++j) {
        const int c = lane_column(j, lane, 32), i = half * 32 + c, t = t0 + i;
        float p = 0.f, ds = 0.f;
        if (active && t < T && sm::allowed(row_mask(mask, b, t, T), s)) {
          p = exp_scaled2(strow[c], scale2, lse_s[i] * kLog2e);
          ds = attn::dscore_unscaled(p, dptrow[c], dot_s[i]);
        }
        prow[c] = MmaType<S>::from(p);
        dptrow[c] = ds;
        ds_max = fmaxf(ds_max, fabsf(ds));
      }
      const float ds_factor = ds_prescale<S, kD>(ds_max, ds_exp, acc_dk);
      __syncwarp();  // every lane has read its scores: dS^T overwrites them
#pragma unroll 4
      for (int j = 0; j < 32; ++j) {
        const int c = lane_column(j, lane, 32);
        dsrow[c] = MmaType<S>::from(dptrow[c] * ds_factor);
      }
      __syncwarp();
      accumulate_pb<M, kD>(acc_dk, dst_w, qs);
    }
    __syncthreads();  // every warp is done with Q, lse and D of this step
    if (t0 + kTile < T) {
      stage_tile<M, kD>(qm, t0 + kTile, T, D, qs);
      stage_floats(lse_bh, t0 + kTile, T, lse_s);
      stage_floats(dot_bh, t0 + kTile, T, dot_s);
      __pipeline_commit();
    }
    if (live) accumulate_pb<M, kD>(acc_dv, pt_w, gs);
  }
  __syncwarp();
  if (!live) return;
  float* stage = st_w;  // [16][kLdOut] fits the warp's two score buffers
  const int64_t at = base + static_cast<int64_t>(w0) * D;
  const int rows = min(16, T - w0);
#pragma unroll
  for (int j = 0; j < kD / 16; ++j) wmma::store_matrix_sync(stage + j * 16, acc_dv[j], kLdOut<kD>, wmma::mem_row_major);
  __syncwarp();
  store_rows<S, kD>(dv + at, stage, 1.f, rows, D, lane);
  __syncwarp();
#pragma unroll
  for (int j = 0; j < kD / 16; ++j) wmma::store_matrix_sync(stage + j * 16, acc_dk[j], kLdOut<kD>, wmma::mem_row_major);
  __syncwarp();
  store_rows<S, kD>(dk + at, stage, ldexpf(scale, ds_exp), rows, D, lane);
#else
  __trap();
#endif
}

// Raises a kernel's dynamic shared-memory limit to what it takes (above 48 KB the
// launch fails without it) on the device of the tensors it runs on.
template <typename Kernel>
void allow_smem(Kernel kernel, size_t bytes, const Tensor& on) {
  gpu::raise_smem_limit(reinterpret_cast<const void*>(kernel), bytes, on.device().record().ordinal);
}

inline dim3 grid_of(const Launch& l) {
  return dim3(l.grid.x, static_cast<unsigned>((l.T + kTile - 1) / kTile));
}

template <typename S, int kD>
void forward_launch(const Launch& l, const Tensor& q, const Tensor& k, const Tensor& v, const MaskArgs& m,
                    float scale, Tensor& out, Tensor& lse) {
  allow_smem(tc_forward_kernel<S, kD>, forward_smem_bytes<kD>(), q);
  tc_forward_kernel<S, kD><<<grid_of(l), kThreads, forward_smem_bytes<kD>(), l.stream>>>(
      q.data_as<S>(), k.data_as<S>(), v.data_as<S>(), m, l.H, l.T, l.D, scale, out.data_as<S>(),
      lse.data_as<float>());
  HR_CUDA_CHECK_LAUNCH();
}

template <typename S, int kD>
void backward_launch(const Launch& l, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& dout,
                     const Tensor& lse, const Tensor& row_dot, const MaskArgs& m, float scale, Tensor& dq, Tensor& dk,
                     Tensor& dv) {
  allow_smem(tc_dq_kernel<S, kD>, dq_smem_bytes<kD>(), q);
  allow_smem(tc_dkv_kernel<S, kD>, dkv_smem_bytes<kD>(), q);
  tc_dq_kernel<S, kD><<<grid_of(l), kThreads, dq_smem_bytes<kD>(), l.stream>>>(
      q.data_as<S>(), k.data_as<S>(), v.data_as<S>(), dout.data_as<S>(), lse.data_as<float>(),
      row_dot.data_as<float>(), m, l.H, l.T, l.D, scale, dq.data_as<S>());
  HR_CUDA_CHECK_LAUNCH();
  tc_dkv_kernel<S, kD><<<grid_of(l), kThreads, dkv_smem_bytes<kD>(), l.stream>>>(
      q.data_as<S>(), k.data_as<S>(), v.data_as<S>(), dout.data_as<S>(), lse.data_as<float>(),
      row_dot.data_as<float>(), m, l.H, l.T, l.D, scale, dk.data_as<S>(), dv.data_as<S>());
  HR_CUDA_CHECK_LAUNCH();
}

// One kernel's ptxas figures and its blocks per SM of `device` at its shared memory.
template <typename Kernel>
TcKernelResources resources_of(const char* name, Kernel kernel, size_t smem, int device) {
  gpu::raise_smem_limit(reinterpret_cast<const void*>(kernel), smem, device);
  const ScopedCudaDevice on(device);
  cudaFuncAttributes a{};
  HR_CUDA_CHECK(cudaFuncGetAttributes(&a, reinterpret_cast<const void*>(kernel)));
  int blocks = 0;
  HR_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, kThreads, smem));
  int sm_smem = 0;
  HR_CUDA_CHECK(cudaDeviceGetAttribute(&sm_smem, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device));
  TcKernelResources r;
  r.kernel = name;
  r.registers = a.numRegs;
  r.local_bytes = a.localSizeBytes;
  r.smem_bytes = smem;
  r.binary_cc = a.binaryVersion;  // the SASS that runs here, built or JIT-compiled for this device
  r.design_sm_smem_bytes = sm_smem_bytes_of(a.binaryVersion);
  r.design_blocks = design_blocks(smem, a.binaryVersion);
  r.blocks_per_sm = blocks;
  r.sm_smem_bytes = static_cast<size_t>(sm_smem);
  return r;
}

template <typename S, int kD>
void kernel_resources(int device, TcKernelResources (&out)[3]) {
  out[0] = resources_of("forward", tc_forward_kernel<S, kD>, forward_smem_bytes<kD>(), device);
  out[1] = resources_of("dq", tc_dq_kernel<S, kD>, dq_smem_bytes<kD>(), device);
  out[2] = resources_of("dkv", tc_dkv_kernel<S, kD>, dkv_smem_bytes<kD>(), device);
}

}  // namespace hr::ops::cuda::attn_tc

#define HR_ATTENTION_TC_INSTANTIATE(kD)                                                                          \
  namespace hr::ops::cuda::attn_tc {                                                                             \
  template void forward_launch<half_t, kD>(const Launch&, const Tensor&, const Tensor&, const Tensor&,          \
                                           const MaskArgs&, float, Tensor&, Tensor&);                            \
  template void forward_launch<bfloat16_t, kD>(const Launch&, const Tensor&, const Tensor&, const Tensor&,      \
                                               const MaskArgs&, float, Tensor&, Tensor&);                        \
  template void backward_launch<half_t, kD>(const Launch&, const Tensor&, const Tensor&, const Tensor&,         \
                                            const Tensor&, const Tensor&, const Tensor&, const MaskArgs&, float, \
                                            Tensor&, Tensor&, Tensor&);                                          \
  template void backward_launch<bfloat16_t, kD>(const Launch&, const Tensor&, const Tensor&, const Tensor&,     \
                                                const Tensor&, const Tensor&, const Tensor&, const MaskArgs&,    \
                                                float, Tensor&, Tensor&, Tensor&);                               \
  template void kernel_resources<half_t, kD>(int, TcKernelResources(&)[3]);                                     \
  template void kernel_resources<bfloat16_t, kD>(int, TcKernelResources(&)[3]);                                 \
  }
