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
// Whether adamw8bit_step takes the tiled kernel for these tensors (a power-of-two
// block of 8 to 2048, parameters and gradients 16-byte aligned, codes 8-byte
// aligned), rather than one thread block per quantisation block.
bool adamw8bit_tiled(const Tensor& param, const Tensor& grad, const Tensor& m_codes, const Tensor& v_codes,
                     int64_t block_size);

}  // namespace hr::ops::cuda
