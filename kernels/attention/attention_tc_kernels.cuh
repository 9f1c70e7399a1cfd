// Memory-efficient attention on tensor cores, fp16 and bf16 (sm_80 and newer), in
// FlashAttention-2's form. One block of four warps takes a tile of 64 query rows
// (forward, dQ) or 64 keys (dK, dV); each warp owns 16 of them. Every product
// (Q K^T, P V, dO V^T, dS K, K Q^T, V dO^T, P^T dO, dS^T Q) runs as mma.sync
// m16n8k16 (16-bit operands, fp32 accumulation), its shared-memory operands loaded
// by ldmatrix, and its result stays in the registers it accumulated in: the scores,
// their softmax (a row's statistics reduced over the four lanes that hold it), P
// and dS. P and dS are rounded to the storage format and fed straight back as the
// next product's A operand, as FlashAttention-2 does (dS in fp16 times a power of
// two that keeps it in range, ds_prescale); every sum stays fp32. The streamed
// operands (K and V, or Q and dO) load by cp.async into two buffers each, a step's
// successor loading while it computes, one block barrier a step. Deterministic: no
// atomics. Include only from the per-head-dim translation units (attention_tc_d*.cu),
// or after suites/common/warp_emulation.hpp, which runs the same kernels on emulated
// warps on a CPU (HR_WARP_EMULATION: its ldmatrix and mma, no launch code).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#if !defined(HR_WARP_EMULATION)
#include <cuda_pipeline_primitives.h>
#endif

#include <cstdint>
#include <type_traits>

#include "harness/cuda_check.cuh"
#include "kernels/common/cuda_launch.cuh"
#include "kernels/attention/attention_launch.hpp"
#include "kernels/attention/attention_mask.cuh"
#include "kernels/attention/attention_math.hpp"
#include "kernels/common/float16.hpp"
#include "kernels/softmax/softmax_math.hpp"

// The kernels' bodies are compiled for sm_80 and newer, and for the emulation.
#if defined(HR_WARP_EMULATION) || (defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800)
#define HR_TC_BODY 1
#else
#define HR_TC_BODY 0
#endif
// A kernel's dynamic shared memory.
#if defined(HR_WARP_EMULATION)
#define HR_TC_SHARED(name) unsigned char* name = ::hr::warp_emu::shared_memory()
#else
#define HR_TC_SHARED(name) extern __shared__ __align__(128) unsigned char name[]
#endif

namespace hr::ops::cuda::attn_tc {

using attn_kernels::Launch;
using attn_kernels::MaskArgs;
using attn_kernels::row_mask;

// The CUDA type of each storage format (same bits), and two floats rounded into the
// halves of one register, the first in the low half (an operand's element order).
template <typename S>
struct MmaType;
template <>
struct MmaType<half_t> {
  using T = __half;
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    const __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&h);
  }
};
template <>
struct MmaType<bfloat16_t> {
  using T = __nv_bfloat16;
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&h);
  }
};

// ---- One warp's products: mma.sync m16n8k16 fed by ldmatrix ---------------------------------
// The fragments, per the PTX ISA ("Matrix Fragments for mma.m16n8k16 with floating
// point type"), for lane 4 g + c (g = lane / 4, c = lane % 4), each register two
// 16-bit elements, the lower column (or k) in the low half:
//   A, 16 x 16 (row, k): a[0] = (g, 2c..2c+1), a[1] = (g + 8, 2c..), a[2] = (g, 2c + 8..),
//                        a[3] = (g + 8, 2c + 8..)
//   B, 16 x 8 (k, n):    b[0] = (2c..2c+1, g), b[1] = (2c + 8.., g)
//   C, 16 x 8 fp32:      c[0], c[1] = (g, 2c), (g, 2c + 1); c[2], c[3] = (g + 8, 2c), (g + 8, 2c + 1)
// So the C tiles of columns [16 k, 16 k + 16), rounded in pairs, are element for
// element the A operand of those 16 columns (to_a): a product's result feeds the
// next without leaving its registers. ldmatrix .x4 gives register i of lane r the
// elements (r / 4, 2 (r % 4)) and (r / 4, 2 (r % 4) + 1) of the 8 x 8 matrix whose
// rows lanes 8 i .. 8 i + 7 address, or with .trans its (2 (r % 4), r / 4) and
// (2 (r % 4) + 1, r / 4).

// The fp32 accumulators of a 16 x kN result: n-tile j holds columns [8 j, 8 j + 8).
template <int kN>
using Acc = float[kN / 8][4];

// The row (0-15) and column of element e of n-tile j that this lane holds.
__device__ __forceinline__ int frag_row(int lane, int e) { return (lane >> 2) + 8 * (e >> 1); }
__device__ __forceinline__ int frag_col(int lane, int j, int e) { return 8 * j + 2 * (lane & 3) + (e & 1); }

template <int kN>
__device__ __forceinline__ void zero(Acc<kN>& acc) {
#pragma unroll
  for (int j = 0; j < kN / 8; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[j][e] = 0.f;
}

#if !defined(HR_WARP_EMULATION)
__device__ __forceinline__ uint32_t smem_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
// The "memory" clobbers keep the compiler from moving shared-memory stores across
// the loads (the outputs stage through the tiles the operands came from).
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_address(p))
               : "memory");
}
__device__ __forceinline__ void ldsm_x4_trans(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_address(p))
               : "memory");
}

// d += a b for one 16 x 8 tile.
template <typename M>
__device__ __forceinline__ void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (std::is_same_v<M, __nv_bfloat16>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    static_assert(std::is_same_v<M, __half>, "fp16 or bf16 operands");
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}
#else
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const void* p) { warp_emu::ldmatrix_x4(r, p, false); }
__device__ __forceinline__ void ldsm_x4_trans(uint32_t (&r)[4], const void* p) { warp_emu::ldmatrix_x4(r, p, true); }
template <typename M>
__device__ __forceinline__ void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  warp_emu::mma_m16n8k16<M>(d, a, b0, b1);
}
#endif

// A over columns [k0, k0 + 16) of the 16 rows at `rows` (row-major, ld elements a
// row): matrices (rows 0-7, k0), (8-15, k0), (0-7, k0 + 8), (8-15, k0 + 8).
template <typename M>
__device__ __forceinline__ void load_a(uint32_t (&a)[4], const M* rows, int ld, int k0, int lane) {
  ldsm_x4(a, rows + ((lane & 7) + ((lane >> 3) & 1) * 8) * ld + k0 + (lane >> 4) * 8);
}
// B of the two n-tiles [n0, n0 + 8) and [n0 + 8, n0 + 16) over k in [k0, k0 + 16),
// from a tile whose row n holds B's column n (K for Q K^T): b[0], b[1] the first
// n-tile's, b[2], b[3] the second's.
template <typename M>
__device__ __forceinline__ void load_b_rows_n(uint32_t (&b)[4], const M* tile, int ld, int n0, int k0, int lane) {
  ldsm_x4(b, tile + (n0 + (lane & 7) + (lane >> 4) * 8) * ld + k0 + ((lane >> 3) & 1) * 8);
}
// The same from a tile whose row k holds B's row k (V for P V), transposed on load.
template <typename M>
__device__ __forceinline__ void load_b_rows_k(uint32_t (&b)[4], const M* tile, int ld, int k0, int n0, int lane) {
  ldsm_x4_trans(b, tile + (k0 + (lane & 7) + ((lane >> 3) & 1) * 8) * ld + n0 + (lane >> 4) * 8);
}

// acc (16 x kN) += A B^T: A the 16 rows at `a`, B the kN rows at `b`, both
// row-major over kK columns (ld elements a row).
template <typename M, int kK, int kN>
__device__ __forceinline__ void mma_abt(Acc<kN>& acc, const M* a, const M* b, int ld, int lane) {
  static_assert(kK % 16 == 0 && kN % 16 == 0, "whole 16 x 16 operand tiles");
#pragma unroll
  for (int kk = 0; kk < kK / 16; ++kk) {
    uint32_t fa[4];
    load_a(fa, a, ld, kk * 16, lane);
#pragma unroll
    for (int j = 0; j < kN / 16; ++j) {
      uint32_t fb[4];
      load_b_rows_n(fb, b, ld, j * 16, kk * 16, lane);
      mma<M>(acc[2 * j], fa, fb[0], fb[1]);
      mma<M>(acc[2 * j + 1], fa, fb[2], fb[3]);
    }
  }
}

// acc (16 x kN) += P B: P (16 x kK) in registers as A operands (to_a), B the kK
// rows at `b` (row-major over kN columns, ld elements a row).
template <typename M, int kK, int kN>
__device__ __forceinline__ void mma_pb(Acc<kN>& acc, const uint32_t (&p)[kK / 16][4], const M* b, int ld, int lane) {
  static_assert(kK % 16 == 0 && kN % 16 == 0, "whole 16 x 16 operand tiles");
#pragma unroll
  for (int kk = 0; kk < kK / 16; ++kk)
#pragma unroll
    for (int j = 0; j < kN / 16; ++j) {
      uint32_t fb[4];
      load_b_rows_k(fb, b, ld, kk * 16, j * 16, lane);
      mma<M>(acc[2 * j], p[kk], fb[0], fb[1]);
      mma<M>(acc[2 * j + 1], p[kk], fb[2], fb[3]);
    }
}

// The A operands of a 16 x kN fp32 result times `factor`, rounded to S.
template <typename S, int kN>
__device__ __forceinline__ void to_a(uint32_t (&p)[kN / 16][4], const Acc<kN>& c, float factor = 1.f) {
#pragma unroll
  for (int kk = 0; kk < kN / 16; ++kk) {
    const float(&lo)[4] = c[2 * kk];
    const float(&hi)[4] = c[2 * kk + 1];
    p[kk][0] = MmaType<S>::pack(lo[0] * factor, lo[1] * factor);
    p[kk][1] = MmaType<S>::pack(lo[2] * factor, lo[3] * factor);
    p[kk][2] = MmaType<S>::pack(hi[0] * factor, hi[1] * factor);
    p[kk][3] = MmaType<S>::pack(hi[2] * factor, hi[3] * factor);
  }
}

// The maximum and the sum over the four lanes that hold one row's elements.
__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// The warp's 16 x kD result, rows g and g + 8 of this lane times f0 and f1, rounded
// into `stage` (the warp's own 16 rows of a tile, ld kLdIn, no longer read by any
// lane) and copied to dst, its first row of D elements; rows from `rows` on are
// left alone. Where the rows are whole 16-byte vectors (D a multiple of 8, dst
// aligned) each lane copies 16-byte vectors, so the warp writes whole rows at once;
// otherwise element by element. Every lane of the warp must call it.
template <typename S, int kD, typename M>
__device__ void store_result(S* __restrict__ dst, M* stage, const Acc<kD>& acc, float f0, float f1, int rows, int D,
                             int lane) {
  constexpr int kLd = kLdIn<kD>;
  __syncwarp();  // every lane has read the operands these rows held
  const int g = lane >> 2, c = 2 * (lane & 3);
#pragma unroll
  for (int j = 0; j < kD / 8; ++j) {
    *reinterpret_cast<uint32_t*>(stage + g * kLd + 8 * j + c) = MmaType<S>::pack(acc[j][0] * f0, acc[j][1] * f0);
    *reinterpret_cast<uint32_t*>(stage + (g + 8) * kLd + 8 * j + c) =
        MmaType<S>::pack(acc[j][2] * f1, acc[j][3] * f1);
  }
  __syncwarp();
  const uint16_t* from = reinterpret_cast<const uint16_t*>(stage);
  uint16_t* to = reinterpret_cast<uint16_t*>(dst);
  if (D % 8 == 0 && reinterpret_cast<uintptr_t>(dst) % 16 == 0) {
    constexpr int kVecs = kD / 8;  // per row
#pragma unroll
    for (int i = lane; i < 16 * kVecs; i += 32) {
      const int row = i / kVecs, col = (i % kVecs) * 8;
      if (row < rows && col < D)
        *reinterpret_cast<uint4*>(to + static_cast<int64_t>(row) * D + col) =
            *reinterpret_cast<const uint4*>(from + row * kLd + col);
    }
  } else {
    for (int i = lane; i < 16 * kD; i += 32) {
      const int row = i / kD, col = i % kD;
      if (row < rows && col < D) to[static_cast<int64_t>(row) * D + col] = from[row * kLd + col];
    }
  }
}

// ---- Tiles, masks and the softmax ----------------------------------------------------------

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
    // A warp's copies of 16 bytes write shared memory in phases of 8 lanes, each
    // without a bank conflict where its 8 chunks fall in 8 different groups of 4
    // banks. From head dim 64 a phase takes 8 chunks of one row. At 32 a row is 4
    // chunks, and 2 rows kLdIn apart (80 bytes) share a group: there the 32 lanes of
    // a warp take 8 rows, a phase one chunk of each (the warp still reads 512
    // contiguous bytes).
    constexpr int kVecs = kD / 8;
    static_assert(kVecs == 4 || kVecs % 8 == 0, "a phase's chunks in distinct bank groups");
    for (int i = threadIdx.x; i < kTile * kVecs; i += blockDim.x) {
      const int r = kVecs == 4 ? (i / 32) * 8 + i % 8 : i / kVecs;
      const int c = (kVecs == 4 ? (i % 32) / 8 : i % kVecs) * 8, row = r0 + r;
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


// Keys below this are allowed for every query row of batch b from row w0 on, when
// there are no segments (a padding mask's key length, the causal mask's first row).
__device__ __forceinline__ int allowed_for_all(const MaskArgs& mask, int b, int T, int w0) {
  int end = T;
  if (mask.kv_len != nullptr) end = min(end, mask.kv_len[b]);
  if (mask.causal) end = min(end, w0 + 1);
  return end;
}

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

// A tile's place in a kernel's shared memory: tile i of kLdIn<kD>-element rows.
template <int kD, typename M>
__device__ __forceinline__ M* tile_at(M* first, int i) {
  return first + i * kTile * kLdIn<kD>;
}

// ---- The kernels ---------------------------------------------------------------------------

// Forward per tile of 64 query rows: for each step of 64 keys, S = Q K^T, the online
// softmax over it (a row's running maximum and sum, the output rescaled when the
// maximum grows), O += P V.
template <typename S, int kD>
__global__ void __launch_bounds__(kThreads, design_blocks(forward_smem_bytes<kD>(), kForwardRegBlocks<kD>))
    tc_forward_kernel(const S* __restrict__ q, const S* __restrict__ k, const S* __restrict__ v, MaskArgs mask, int H,
                      int T, int D, float scale, S* __restrict__ out, float* __restrict__ lse) {
#if HR_TC_BODY
  using M = typename MmaType<S>::T;
  constexpr int kLd = kLdIn<kD>;
  HR_TC_SHARED(smem);
  M* qs = reinterpret_cast<M*>(smem);  // then K twice, V twice
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int bh = blockIdx.x, b = bh / H;
  const int t0 = query_tile(mask) * kTile, w0 = t0 + warp * 16;  // the block's and the warp's first row
  const int64_t base = static_cast<int64_t>(bh) * T * D;
  const M* km = reinterpret_cast<const M*>(k) + base;
  const M* vm = reinterpret_cast<const M*>(v) + base;
  M* qw = tile_at<kD>(qs, 0) + warp * 16 * kLd;  // the warp's rows of Q
  // This lane's rows of the warp, w0 + g (h = 0) and w0 + g + 8 (h = 1).
  bool active[2];
  sm::RowMask rm[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int t = w0 + frag_row(lane, 2 * h);
    active[h] = t < T;
    rm[h] = active[h] ? row_mask(mask, b, t, T) : sm::RowMask{false, 0, 0, nullptr};
  }
  const int all_end = allowed_for_all(mask, b, T, w0);
  stage_tile<M, kD>(reinterpret_cast<const M*>(q) + base, t0, T, D, tile_at<kD>(qs, 0));
  stage_tile<M, kD>(km, 0, T, D, tile_at<kD>(qs, 1));
  stage_tile<M, kD>(vm, 0, T, D, tile_at<kD>(qs, 3));
  __pipeline_commit();
  Acc<kD> o;  // the unnormalised output
  zero<kD>(o);
  float m2[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};  // running maximum (base 2) and this lane's part of the sum
  const float scale2 = scale * kLog2e;
  const int w_last = min(T, w0 + 16) - 1;
  // A causal block sees no key past its last row.
  const int s_end = mask.causal ? min(T, t0 + kTile) : T;
  for (int s0 = 0, buf = 0; s0 < s_end; s0 += kTile, buf ^= 1) {
    landed();  // this step's K and V; every warp is done with the last step's
    if (s0 + kTile < s_end) {
      stage_tile<M, kD>(km, s0 + kTile, T, D, tile_at<kD>(qs, 1 + (buf ^ 1)));
      stage_tile<M, kD>(vm, s0 + kTile, T, D, tile_at<kD>(qs, 3 + (buf ^ 1)));
      __pipeline_commit();
    }
    const bool live = w0 < T && !(mask.causal && s0 > w_last);  // uniform across the warp
    if (!live) continue;
    Acc<kTile> s;
    zero<kTile>(s);
    mma_abt<M, kD, kTile>(s, qw, tile_at<kD>(qs, 1 + buf), kLd, lane);
    // Masked scores become -inf; a step wholly inside every row's allowed keys skips the test.
    const bool whole = mask.seg == nullptr && s0 + kTile <= all_end;
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int j = 0; j < kTile / 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int h = e >> 1, key = s0 + frag_col(lane, j, e);
        if (!active[h] || !(whole || (key < T && sm::allowed(rm[h], key))))
          s[j][e] = -INFINITY;
        else
          mx[h] = fmaxf(mx[h], scale2 * s[j][e]);
      }
    float factor[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) factor[h] = attn::online_rescale(m2[h], l[h], quad_max(mx[h]), Exp2{});
    if (factor[0] != 1.f || factor[1] != 1.f) {
#pragma unroll
      for (int j = 0; j < kD / 8; ++j) {
        o[j][0] *= factor[0];
        o[j][1] *= factor[0];
        o[j][2] *= factor[1];
        o[j][3] *= factor[1];
      }
    }
#pragma unroll
    for (int j = 0; j < kTile / 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int h = e >> 1;
        s[j][e] = s[j][e] == -INFINITY ? 0.f : exp_scaled2(s[j][e], scale2, m2[h]);
        l[h] += s[j][e];
      }
    uint32_t p[kTile / 16][4];
    to_a<S, kTile>(p, s);
    mma_pb<M, kTile, kD>(o, p, tile_at<kD>(qs, 3 + buf), kLd, lane);
  }
  if (w0 >= T) return;  // uniform across the warp
  float inv[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l[h] = quad_sum(l[h]);
    inv[h] = active[h] ? attn::inv_row_sum(l[h]) : 0.f;
  }
  store_result<S, kD>(out + base + static_cast<int64_t>(w0) * D, qw, o, inv[0], inv[1], min(16, T - w0), D, lane);
  if ((lane & 3) == 0) {
#pragma unroll
    for (int h = 0; h < 2; ++h)
      if (active[h])
        lse[static_cast<int64_t>(bh) * T + w0 + frag_row(lane, 2 * h)] = attn::row_lse(m2[h] * kLn2, l[h]);
  }
#else
  __trap();  // the dispatcher selects these kernels only on sm_80 and newer
#endif
}

// fp16 ends at 65504, and at large loss scales a step's dS can pass it where the
// scalar kernels, which keep dS in fp32, stay finite. In fp16 a warp rounds its dS
// times 2^-e, with e >= 0 the smallest that has put every step's largest |dS| below
// 2^14 so far: when a step needs a larger e, the accumulator it feeds is scaled down
// by the difference, and the result is scaled up by 2^e when stored (all exact:
// powers of two). bf16 has fp32's range and keeps e = 0. Returns 2^-e. Every lane of
// the warp must call it.
template <typename S, int kD>
__device__ float ds_prescale(float max_abs, int& e, Acc<kD>& acc) {
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
        for (int j = 0; j < kD / 8; ++j)
#pragma unroll
          for (int i = 0; i < 4; ++i) acc[j][i] *= down;
        e = need;
      }
    }
    return ldexpf(1.f, -e);
  }
}

// dQ per tile of 64 query rows: for each step of 64 keys, dP = dO V^T and S = Q K^T,
// then dS = P (dP - D_i) rounded to 16 bits, dQ += dS K.
template <typename S, int kD>
__global__ void __launch_bounds__(kThreads, design_blocks(dq_smem_bytes<kD>(), kBackwardRegBlocks<kD>))
    tc_dq_kernel(const S* __restrict__ q, const S* __restrict__ k, const S* __restrict__ v,
                 const S* __restrict__ dout, const float* __restrict__ lse, const float* __restrict__ row_dot,
                 MaskArgs mask, int H, int T, int D, float scale, S* __restrict__ dq) {
#if HR_TC_BODY
  using M = typename MmaType<S>::T;
  constexpr int kLd = kLdIn<kD>;
  HR_TC_SHARED(smem);
  M* tiles = reinterpret_cast<M*>(smem);  // Q, dO, then K twice, V twice
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int bh = blockIdx.x, b = bh / H;
  const int t0 = query_tile(mask) * kTile, w0 = t0 + warp * 16;
  const int64_t base = static_cast<int64_t>(bh) * T * D;
  const M* km = reinterpret_cast<const M*>(k) + base;
  const M* vm = reinterpret_cast<const M*>(v) + base;
  M* qw = tile_at<kD>(tiles, 0) + warp * 16 * kLd;
  const M* gw = tile_at<kD>(tiles, 1) + warp * 16 * kLd;
  bool active[2];
  sm::RowMask rm[2];
  float lse2[2], dot[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int t = w0 + frag_row(lane, 2 * h);
    active[h] = t < T;
    rm[h] = active[h] ? row_mask(mask, b, t, T) : sm::RowMask{false, 0, 0, nullptr};
    lse2[h] = active[h] ? lse[static_cast<int64_t>(bh) * T + t] * kLog2e : 0.f;
    dot[h] = active[h] ? row_dot[static_cast<int64_t>(bh) * T + t] : 0.f;
  }
  const int all_end = allowed_for_all(mask, b, T, w0);
  const float scale2 = scale * kLog2e;
  stage_tile<M, kD>(reinterpret_cast<const M*>(q) + base, t0, T, D, tile_at<kD>(tiles, 0));
  stage_tile<M, kD>(reinterpret_cast<const M*>(dout) + base, t0, T, D, tile_at<kD>(tiles, 1));
  stage_tile<M, kD>(km, 0, T, D, tile_at<kD>(tiles, 2));
  stage_tile<M, kD>(vm, 0, T, D, tile_at<kD>(tiles, 4));
  __pipeline_commit();
  Acc<kD> acc;
  zero<kD>(acc);
  int ds_exp = 0;  // dS is rounded times 2^-ds_exp (ds_prescale)
  const int w_last = min(T, w0 + 16) - 1;
  const int s_end = mask.causal ? min(T, t0 + kTile) : T;
  for (int s0 = 0, buf = 0; s0 < s_end; s0 += kTile, buf ^= 1) {
    landed();  // this step's K and V; every warp is done with the last step's
    if (s0 + kTile < s_end) {
      stage_tile<M, kD>(km, s0 + kTile, T, D, tile_at<kD>(tiles, 2 + (buf ^ 1)));
      stage_tile<M, kD>(vm, s0 + kTile, T, D, tile_at<kD>(tiles, 4 + (buf ^ 1)));
      __pipeline_commit();
    }
    const bool live = w0 < T && !(mask.causal && s0 > w_last);  // uniform across the warp
    if (!live) continue;
    const M* ks = tile_at<kD>(tiles, 2 + buf);
    Acc<kTile> dp, s;
    zero<kTile>(dp);
    zero<kTile>(s);
    mma_abt<M, kD, kTile>(dp, gw, tile_at<kD>(tiles, 4 + buf), kLd, lane);
    mma_abt<M, kD, kTile>(s, qw, ks, kLd, lane);
    const bool whole = mask.seg == nullptr && s0 + kTile <= all_end;
    float ds_max = 0.f;
#pragma unroll
    for (int j = 0; j < kTile / 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int h = e >> 1, key = s0 + frag_col(lane, j, e);
        float ds = 0.f;
        if (active[h] && (whole || (key < T && sm::allowed(rm[h], key))))
          ds = attn::dscore_unscaled(exp_scaled2(s[j][e], scale2, lse2[h]), dp[j][e], dot[h]);
        s[j][e] = ds;
        ds_max = fmaxf(ds_max, fabsf(ds));
      }
    const float ds_factor = ds_prescale<S, kD>(ds_max, ds_exp, acc);
    uint32_t ds16[kTile / 16][4];
    to_a<S, kTile>(ds16, s, ds_factor);
    mma_pb<M, kTile, kD>(acc, ds16, ks, kLd, lane);
  }
  if (w0 >= T) return;
  const float f = ldexpf(scale, ds_exp);
  store_result<S, kD>(dq + base + static_cast<int64_t>(w0) * D, qw, acc, f, f, min(16, T - w0), D, lane);
#else
  __trap();
#endif
}

// dK, dV per tile of 64 keys: for each step of 64 queries, in parts of kDkvPart
// (their scores and dP^T in registers at once), S^T = K Q^T and dP^T = V dO^T, P^T
// from the saved log-sum-exp, dS^T = P^T (dP^T - D); dV += P^T dO and dK += dS^T Q.
template <typename S, int kD>
__global__ void __launch_bounds__(kThreads, design_blocks(dkv_smem_bytes<kD>(), kBackwardRegBlocks<kD>))
    tc_dkv_kernel(const S* __restrict__ q, const S* __restrict__ k, const S* __restrict__ v,
                  const S* __restrict__ dout, const float* __restrict__ lse, const float* __restrict__ row_dot,
                  MaskArgs mask, int H, int T, int D, float scale, S* __restrict__ dk, S* __restrict__ dv) {
#if HR_TC_BODY
  using M = typename MmaType<S>::T;
  constexpr int kLd = kLdIn<kD>, kPart = kDkvPart;
  HR_TC_SHARED(smem);
  M* tiles = reinterpret_cast<M*>(smem);  // K, V, then Q twice, dO twice
  float* lse_s = reinterpret_cast<float*>(tile_at<kD>(tiles, 6));  // two buffers of kTile
  float* dot_s = lse_s + 2 * kTile;                                  // two buffers of kTile
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int bh = blockIdx.x, b = bh / H;
  // Causal: key tile 0 sees every query, the heaviest first already (query_tile).
  const int s_first = blockIdx.y * kTile, w0 = s_first + warp * 16;
  const int64_t base = static_cast<int64_t>(bh) * T * D;
  const M* qm = reinterpret_cast<const M*>(q) + base;
  const M* gm = reinterpret_cast<const M*>(dout) + base;
  const float* lse_bh = lse + static_cast<int64_t>(bh) * T;
  const float* dot_bh = row_dot + static_cast<int64_t>(bh) * T;
  M* kw = tile_at<kD>(tiles, 0) + warp * 16 * kLd;  // the warp's keys
  M* vw = tile_at<kD>(tiles, 1) + warp * 16 * kLd;
  const bool live = w0 < T;  // uniform across the warp
  // Every key of the warp is below T and the key length (a padding mask's).
  const bool keys_whole =
      w0 + 16 <= T && (mask.kv_len == nullptr || w0 + 16 <= mask.kv_len[b]);
  // Causal: queries before the block's first key see none of its keys.
  const int t_begin = mask.causal ? s_first : 0;
  const float scale2 = scale * kLog2e;
  stage_tile<M, kD>(reinterpret_cast<const M*>(k) + base, s_first, T, D, tile_at<kD>(tiles, 0));
  stage_tile<M, kD>(reinterpret_cast<const M*>(v) + base, s_first, T, D, tile_at<kD>(tiles, 1));
  stage_tile<M, kD>(qm, t_begin, T, D, tile_at<kD>(tiles, 2));
  stage_tile<M, kD>(gm, t_begin, T, D, tile_at<kD>(tiles, 4));
  stage_floats(lse_bh, t_begin, T, lse_s);
  stage_floats(dot_bh, t_begin, T, dot_s);
  __pipeline_commit();
  Acc<kD> acc_dk, acc_dv;
  zero<kD>(acc_dk);
  zero<kD>(acc_dv);
  int ds_exp = 0;  // dS^T is rounded times 2^-ds_exp (ds_prescale)
  for (int t0 = t_begin, buf = 0; t0 < T; t0 += kTile, buf ^= 1) {
    landed();  // this step's Q, dO and their rows' statistics; every warp is done with the last step's
    if (t0 + kTile < T) {
      stage_tile<M, kD>(qm, t0 + kTile, T, D, tile_at<kD>(tiles, 2 + (buf ^ 1)));
      stage_tile<M, kD>(gm, t0 + kTile, T, D, tile_at<kD>(tiles, 4 + (buf ^ 1)));
      stage_floats(lse_bh, t0 + kTile, T, lse_s + (buf ^ 1) * kTile);
      stage_floats(dot_bh, t0 + kTile, T, dot_s + (buf ^ 1) * kTile);
      __pipeline_commit();
    }
    if (!live) continue;
#pragma unroll 1
    for (int part = 0; part < kTile; part += kPart) {
      const int c0 = t0 + part;  // the part's first query
      // Causal: a part whose queries all precede the warp's first key sees none of them.
      if (mask.causal && c0 + kPart - 1 < w0) continue;  // uniform across the warp
      const M* qp = tile_at<kD>(tiles, 2 + buf) + part * kLd;
      const M* gp = tile_at<kD>(tiles, 4 + buf) + part * kLd;
      const float* lse_p = lse_s + buf * kTile + part;
      const float* dot_p = dot_s + buf * kTile + part;
      Acc<kPart> st, dpt;
      zero<kPart>(st);
      zero<kPart>(dpt);
      mma_abt<M, kD, kPart>(st, kw, qp, kLd, lane);
      mma_abt<M, kD, kPart>(dpt, vw, gp, kLd, lane);
      // Wholly allowed: no segments, every query below T and (causal) at or after every key.
      const bool whole = mask.seg == nullptr && keys_whole && c0 + kPart <= T && (!mask.causal || c0 >= w0 + 15);
      float ds_max = 0.f;
#pragma unroll
      for (int j = 0; j < kPart / 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int col = frag_col(lane, j, e), t = c0 + col, key = w0 + frag_row(lane, e);
          float p = 0.f, ds = 0.f;
          if (whole || (key < T && t < T && sm::allowed(row_mask(mask, b, t, T), key))) {
            p = exp_scaled2(st[j][e], scale2, lse_p[col] * kLog2e);
            ds = attn::dscore_unscaled(p, dpt[j][e], dot_p[col]);
          }
          st[j][e] = p;
          dpt[j][e] = ds;
          ds_max = fmaxf(ds_max, fabsf(ds));
        }
      uint32_t a16[kPart / 16][4];
      to_a<S, kPart>(a16, st);
      mma_pb<M, kPart, kD>(acc_dv, a16, gp, kLd, lane);
      const float ds_factor = ds_prescale<S, kD>(ds_max, ds_exp, acc_dk);
      to_a<S, kPart>(a16, dpt, ds_factor);
      mma_pb<M, kPart, kD>(acc_dk, a16, qp, kLd, lane);
    }
  }
  if (!live) return;
  const int64_t at = base + static_cast<int64_t>(w0) * D;
  const int rows = min(16, T - w0);
  store_result<S, kD>(dv + at, vw, acc_dv, 1.f, 1.f, rows, D, lane);
  const float f = ldexpf(scale, ds_exp);
  store_result<S, kD>(dk + at, kw, acc_dk, f, f, rows, D, lane);
#else
  __trap();
#endif
}

#if !defined(HR_WARP_EMULATION)
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
TcKernelResources resources_of(const char* name, Kernel kernel, size_t smem, int reg_blocks, int device) {
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
  r.code_cc = a.ptxVersion;       // compute_XX of that code: below 80 the kernels' bodies are traps
  r.design_sm_smem_bytes = sm_smem_bytes_of(a.binaryVersion);
  r.design_blocks = design_blocks(smem, reg_blocks, a.binaryVersion);
  r.blocks_per_sm = blocks;
  r.sm_smem_bytes = static_cast<size_t>(sm_smem);
  return r;
}

template <typename S, int kD>
void kernel_resources(int device, TcKernelResources (&out)[3]) {
  out[0] = resources_of("forward", tc_forward_kernel<S, kD>, forward_smem_bytes<kD>(), kForwardRegBlocks<kD>, device);
  out[1] = resources_of("dq", tc_dq_kernel<S, kD>, dq_smem_bytes<kD>(), kBackwardRegBlocks<kD>, device);
  out[2] = resources_of("dkv", tc_dkv_kernel<S, kD>, dkv_smem_bytes<kD>(), kBackwardRegBlocks<kD>, device);
}

template <typename S, int kD>
int code_cc(int device) {
  const ScopedCudaDevice on(device);
  cudaFuncAttributes a{};
  if (cudaFuncGetAttributes(&a, reinterpret_cast<const void*>(tc_forward_kernel<S, kD>)) != cudaSuccess) {
    (void)cudaGetLastError();  // not left for the next launch's check to report
    return 0;
  }
  return a.ptxVersion;
}

#endif  // !HR_WARP_EMULATION

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
  template int code_cc<bfloat16_t, kD>(int);                                                                    \
  }
