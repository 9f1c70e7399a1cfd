// Launch-shape helpers shared by the CUDA kernels (CUDA translation units only):
// grid sizes for grid-stride loops, 16-byte packs for vectorised loads and
// stores, and the alignment test that decides whether a pack path is legal
// (tensor views made by slice() need not be 16-byte aligned).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "harness/tensor.hpp"

namespace hr::gpu {

inline constexpr int kThreads = 256;
// Grid-stride loops cover any size; past this many blocks each thread loops.
inline constexpr int64_t kMaxBlocks = 65536;

inline unsigned grid_for(int64_t work_items, int threads = kThreads) {
  const int64_t blocks = (work_items + threads - 1) / threads;
  return static_cast<unsigned>(std::clamp<int64_t>(blocks, 1, kMaxBlocks));
}

inline cudaStream_t stream_of(const Tensor& t) { return static_cast<cudaStream_t>(t.device().cuda_stream()); }

// Raises `kernel`'s dynamic shared-memory limit to `bytes` on CUDA device `device`
// (the limit is a setting of each device, not of the process), once per kernel and
// device; the current device is left as it was (cuda_launch.cu).
void raise_smem_limit(const void* kernel, size_t bytes, int device);

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// Row and column of a grid-stride loop over a row-major [rows, cols] array, without
// a 64-bit division and modulo per element (each some tens of instructions; these
// kernels are memory-bound and should stay so): the thread's first index is split
// once, and each stride moves row and column by the stride's own split.
struct RowColCursor {
  int64_t row, col;
  int64_t d_row, d_col, cols;
  __device__ RowColCursor(int64_t first, int64_t stride, int64_t cols_)
      : row(first / cols_), col(first % cols_), d_row(stride / cols_), d_col(stride % cols_), cols(cols_) {}
  __device__ void advance() {
    row += d_row;
    col += d_col;
    if (col >= cols) {
      col -= cols;
      ++row;
    }
  }
};

// N elements of T moved as one aligned load/store.
template <typename T, int N>
struct alignas(sizeof(T) * N) Pack {
  T v[N];
};

}  // namespace hr::gpu
