// Token + position embedding: out[b, t] = wte[ids[b, t]] + wpe[pos[b, t]]. Positions
// are given explicitly so a packed row restarts them at each sequence.
#pragma once

#include <cstdint>
#include <vector>

#include "harness/tensor.hpp"

namespace hr::ops {

// The ids' and positions' values on the host, when the caller has them (a Batch
// does): the checks and the gradient's index then read them, not the device.
struct EmbeddingHostIds {
  const std::vector<int32_t>* ids = nullptr;
  const std::vector<int32_t>* pos = nullptr;
};

// ids, pos: int32 [B, T]; wte [V, C]; wpe [Tmax, C]; out [B, T, C]. Out-of-range
// ids or positions throw (checked on the host before launch).
void embedding_forward(const Tensor& ids, const Tensor& pos, const Tensor& wte, const Tensor& wpe, Tensor& out,
                       const EmbeddingHostIds& host = {});
// dwte[v] += sum of dout over tokens with id v; dwpe likewise (fp32; deterministic order).
void embedding_backward(const Tensor& ids, const Tensor& pos, const Tensor& dout, Tensor& dwte, Tensor& dwpe,
                        const EmbeddingHostIds& host = {});

}  // namespace hr::ops
