// 8-bit optimizer state: block-wise dynamic quantisation of fp32 tensors (codes
// in uint8, one fp32 absmax per block) and AdamW whose two moments live in that
// form between steps (kernels/optim/quant8_math.hpp holds the shared math).
#pragma once

#include <cstdint>

#include "harness/tensor.hpp"
#include "kernels/optim/optim.hpp"
#include "kernels/optim/quant8_math.hpp"

namespace hr::ops {

// x (fp32, any shape) -> codes (uint8, x's numel) and absmax (fp32, one per block
// of `block_size` consecutive elements; the last block may be shorter).
void quantize_blockwise(const Tensor& x, Tensor& codes, Tensor& absmax, int64_t block_size, q8::MapKind map);
// The inverse: out (fp32, codes' numel) = map[code] * absmax[block].
void dequantize_blockwise(const Tensor& codes, const Tensor& absmax, Tensor& out, int64_t block_size,
                          q8::MapKind map);

struct AdamW8bitOptions {
  int64_t block_size = q8::kDefaultBlock;  // 256, or 2048; any positive size is accepted
  q8::MapKind m_map = q8::MapKind::dynamic_signed;
  q8::MapKind v_map = q8::MapKind::dynamic_unsigned;
};

// One AdamW step with 8-bit moments: param fp32 (or 16-bit), grad any float,
// m_codes / v_codes uint8 of param's numel, m_absmax / v_absmax fp32 of
// ceil(numel / block_size). step is 1-based.
void adamw8bit_step(Tensor& param, const Tensor& grad, Tensor& m_codes, Tensor& m_absmax, Tensor& v_codes,
                    Tensor& v_absmax, int64_t step, const AdamWConfig& cfg, const AdamW8bitOptions& opt = {});

}  // namespace hr::ops
