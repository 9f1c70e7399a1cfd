// Fault switches of the ops (one family of harness/faults.hpp): a broken op for the
// controls of OPS-1 (an op against float64) and DET-1 (an op twice, bitwise). The
// fault acts inside the op's public entry point, after the backend computed, so the
// same switch breaks the CPU loop and the CUDA kernel alike. Ops that read it:
// matmul (also the silent corruption of `headroom fleet`), linear_forward (its output with the bias),
// layernorm_forward, softmax_forward, gelu_forward, cross_entropy_forward,
// attention_forward (its output, the memory-efficient form's saved log-sum-exp, and
// cuDNN's rows without keys), attention_backward (cuDNN's rows without keys) and
// batchnorm_backward (its contribution to dgamma).
// matmul's output faults act on c as stored after the product: where c held values
// before it (beta = 1: the CPU's fused bias of linear_forward, an accumulated dx),
// those are perturbed with it.
#pragma once

#include <cstdint>
#include <string>

#include "harness/faults.hpp"

namespace hr {
class Tensor;
}

namespace hr::ops {

struct OpFault {
  std::string op;                 // the entry point it breaks; empty: no fault
  double output_rel_error = 0;    // every stored output element off by this relative amount, signs alternating
  int64_t unstable_elements = 0;  // on every other call, this many output elements one ulp up
  int input_bits = 0;             // matmul: a read rounded to this many significand bits (TF32 keeps 10)
  bool transpose_b = false;       // matmul: b read transposed (b square)
  // attention_forward, memory-efficient form: every row's saved log-sum-exp off by
  // this, so the backward pass recomputes each probability e^-lse_offset times its
  // value (the forward output is untouched; PK-4's subtle control).
  double lse_offset = 0;
  // attention_forward and attention_backward: every call runs the other form than
  // the one asked for (naive <-> memory-efficient), as a dispatch that ignores the
  // setting does (PK-4's exponent controls).
  bool swap_attention_forms = false;
  // attention_forward and attention_backward through cuDNN: the batch rows with no
  // visible key (key length <= 0) written with this value, not the own kernels'
  // zeros (the controls of the check that they are zeros).
  double keyless_fill = 0;
  // A silent data corruption (`headroom fleet`, HEADROOM_INJECT_SDC): on the op's
  // flip_on_call-th call while set (1-based; 0: never), bit flip_bit of the middle
  // element of its stored output flipped, once.
  int64_t flip_on_call = 0;
  int flip_bit = 12;
};

// Sets the op fault for its lifetime.
using ScopedOpFault = faults::Scoped<OpFault>;

// The fault set for `op` while the switches are armed, or nullptr.
const OpFault* op_fault(const char* op);

// Applies the output faults set for `op` to its stored output `out`.
void apply_output_fault(const char* op, Tensor& out);

// `v` rounded to nearest with `bits` significand bits after the leading one.
float round_significand(float v, int bits);

}  // namespace hr::ops

HR_DECLARE_FAULT_SLOT(hr::ops::OpFault);
