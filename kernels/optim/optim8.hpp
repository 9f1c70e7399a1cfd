// 8-bit optimizer state: block-wise dynamic quantisation of fp32 tensors (codes
// in uint8, one fp32 absmax per block) and AdamW whose two moments live in that
// form between steps (kernels/optim/quant8_math.hpp holds the shared math).
#pragma once

#include <cstdint>
#include <vector>

#include "harness/faults.hpp"
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

// Fault switches of 8-bit optimizer state (harness/faults.hpp): each a bug of the
// quantiser, the optimizer or its checkpoint, for Q8-1..Q8-5's negative controls.
struct Q8Fault {
  bool linear_maps = false;            // every dynamic map read as the linear map of its sign
  bool truncate = false;               // quantisation keeps the code at or below the value, not the nearest
  bool first_moment_unsigned = false;  // the first moment stored in the unsigned map: its sign lost
  bool one_absmax_per_tensor = false;  // one block the size of the tensor
  int64_t block_factor = 0;            // > 1: blocks this many times the configured size
  bool fp32_state = false;             // the optimizer keeps fp32 moments (8 bytes per parameter)
  bool shared_absmax = false;          // one absmax per block for both moments (the second's overwrites the first's)
  bool absmax_not_saved = false;       // a checkpoint leaves the absmax out: zeros on reload
  bool requantise_on_save = false;     // a checkpoint holds the moments dequantised; quantised again on load
  bool reload_absmax_ulp = false;      // a reload leaves the first absmax one ulp up
  // Quantisation stores the signed map's lowest code (-1 x absmax) as the code of
  // zero, as a sign-and-magnitude encoder that writes -1 as "-0" does: a block whose
  // largest magnitude is negative loses that element (Q8-2's state check, subtle).
  bool lowest_code_as_zero = false;
};
using ScopedQ8Fault = faults::Scoped<Q8Fault>;

// The options a tensor of `numel` elements is stored with: `opt` with the switched-on
// faults that change the map or the block applied (callers that allocate or resync
// 8-bit state use it, so the state has the shape the step will read).
AdamW8bitOptions applied_options(const AdamW8bitOptions& opt, int64_t numel);

// One AdamW step with 8-bit moments: param fp32 (or 16-bit), grad any float,
// m_codes / v_codes uint8 of param's numel, m_absmax / v_absmax fp32 of
// ceil(numel / block_size). step is 1-based.
void adamw8bit_step(Tensor& param, const Tensor& grad, Tensor& m_codes, Tensor& m_absmax, Tensor& v_codes,
                    Tensor& v_absmax, int64_t step, const AdamWConfig& cfg, const AdamW8bitOptions& opt = {});

// One tensor of a many-tensor step: the arguments of adamw8bit_step, by pointer.
struct AdamW8bitTensor {
  Tensor* param;
  const Tensor* grad;
  Tensor* m_codes;
  Tensor* m_absmax;
  Tensor* v_codes;
  Tensor* v_absmax;
  AdamWConfig cfg;
  AdamW8bitOptions opt;
};
// adamw8bit_step on each tensor, with the same result bit for bit; every tensor is
// checked before any is stepped, and no parameter may be listed twice. On a GPU the tensors that take the tiled kernel
// and share a device, dtypes, block size and maps are stepped together, a few dozen
// to a launch (an optimizer's step is otherwise one launch and its host work per
// tensor, which for the small tensors of a model costs more than their bytes).
void adamw8bit_step_many(const std::vector<AdamW8bitTensor>& tensors, int64_t step);

}  // namespace hr::ops

HR_DECLARE_FAULT_SLOT(hr::ops::Q8Fault);
