// CUDA entry points of the 8-bit optimizer state (defined in optim8.cu, called
// from optim8.cpp after its checks).
#pragma once

#include <vector>

#include "harness/tensor.hpp"
#include "kernels/optim/quant8_math.hpp"

namespace hr::ops::cuda {

void quantize_blockwise(const Tensor& x, Tensor& codes, Tensor& absmax, int64_t block_size, const q8::Codebook& map);
void dequantize_blockwise(const Tensor& codes, const Tensor& absmax, Tensor& out, int64_t block_size,
                          const q8::Codebook& map);
void adamw8bit_step(Tensor& param, const Tensor& grad, Tensor& m_codes, Tensor& m_absmax, Tensor& v_codes,
                    Tensor& v_absmax, int64_t block_size, const q8::Codebook& m_map, const q8::Codebook& v_map,
                    const optim::AdamWScalars& s);
// One AdamW step of many tensors in as few launches as their count allows (each a
// launch of the tiled kernel's tiles, kernels/optim/optim8.cu): the same bits as
// adamw8bit_step on each. The caller groups them: one device, one dtype pair, one
// block size and pair of maps, every tensor one that adamw8bit_tiled takes.
struct AdamW8bitArgs {
  Tensor* param;
  const Tensor* grad;
  Tensor* m_codes;
  Tensor* m_absmax;
  Tensor* v_codes;
  Tensor* v_absmax;
  optim::AdamWScalars s;
};
void adamw8bit_step_many(const std::vector<AdamW8bitArgs>& ts, int64_t block_size, const q8::Codebook& m_map,
                         const q8::Codebook& v_map);
// Puts both maps on the device of `on` (a first use uploads them: CUDA calls that may
// throw), so that a many-tensor step can do it for every group before it launches any.
void upload_codebooks(const q8::Codebook& m_map, const q8::Codebook& v_map, const Tensor& on);
// The most tensors one launch of adamw8bit_step_many takes.
int adamw8bit_tensors_per_launch();
// Whether adamw8bit_step takes the tiled kernel for these tensors (a power-of-two
// block of 8 to 2048, parameters and gradients 16-byte aligned, codes 8-byte
// aligned), rather than one thread block per quantisation block.
bool adamw8bit_tiled(const Tensor& param, const Tensor& grad, const Tensor& m_codes, const Tensor& v_codes,
                     int64_t block_size);

}  // namespace hr::ops::cuda
