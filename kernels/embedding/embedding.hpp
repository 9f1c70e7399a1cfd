// Token + position embedding: out[b, t] = wte[ids[b, t]] + wpe[pos[b, t]]. Positions
// are given explicitly so a packed row restarts them at each sequence.
#pragma once

#include "harness/tensor.hpp"

namespace hr::ops {

// ids, pos: int32 [B, T]; wte [V, C]; wpe [Tmax, C]; out [B, T, C]. Out-of-range
// ids or positions throw (checked on the host before launch).
void embedding_forward(const Tensor& ids, const Tensor& pos, const Tensor& wte, const Tensor& wpe, Tensor& out);
// dwte[v] += sum of dout over tokens with id v; dwpe likewise (fp32; deterministic order).
void embedding_backward(const Tensor& ids, const Tensor& pos, const Tensor& dout, Tensor& dwte, Tensor& dwpe);

}  // namespace hr::ops
