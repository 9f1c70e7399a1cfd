// The mask of one query row as the attention kernels see it (device pointers in
// MaskArgs), shared by the scalar and the tensor-core kernels so both mask alike.
#pragma once

#include <climits>
#include <cstdint>

#include "kernels/attention/attention_launch.hpp"
#include "kernels/softmax/softmax_math.hpp"

namespace hr::ops::cuda::attn_kernels {

__device__ inline sm::RowMask row_mask(const MaskArgs& m, int b, int t, int T) {
  return sm::RowMask{m.causal, t, m.kv_len ? m.kv_len[b] : INT32_MAX, m.seg ? m.seg + static_cast<int64_t>(b) * T
                                                                             : nullptr};
}

}  // namespace hr::ops::cuda::attn_kernels
