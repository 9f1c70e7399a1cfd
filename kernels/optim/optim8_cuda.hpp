// CUDA entry points of the 8-bit optimizer state (defined in optim8.cu, called
// from optim8.cpp after its checks).
#pragma once

#include "harness/tensor.hpp"
#include "kernels/optim/quant8_math.hpp"

namespace hr::ops::cuda {

void quantize_blockwise(const Tensor& x, Tensor& codes, Tensor& absmax, int64_t block_size, const q8::Codebook& map);
void dequantize_blockwise(const Tensor& codes, const Tensor& absmax, Tensor& out, int64_t block_size,
                          const q8::Codebook& map);
void adamw8bit_step(Tensor& param, const Tensor& grad, Tensor& m_codes, Tensor& m_absmax, Tensor& v_codes,
                    Tensor& v_absmax, int64_t block_size, const q8::Codebook& m_map, const q8::Codebook& v_map,
                    const optim::AdamWScalars& s);

}  // namespace hr::ops::cuda
