// One batch of input for a controlled model, on the device. Every tensor has the
// batch rows as dim 0, so a micro-batch is a slice of rows of each (views, no
// copies). Data tensors are charged to Consumer::workspace: they belong to the
// data pipeline, not to the four consumers of the training step.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "harness/tensor.hpp"

namespace hr {

struct Batch {
  // ---- transformer ----
  Tensor ids;            // int32 [B, T] token ids
  Tensor pos;            // int32 [B, T] positions (restart at each packed sequence)
  Tensor targets;        // int32 [B, T] (transformer) or [B] (MLP classification); ignore_index = no loss
  Tensor key_valid_len;  // int32 [B] or undefined: keys s >= len are padding
  Tensor segment_ids;    // int32 [B, T] or undefined: packed rows attend within a segment only
  // ---- MLP ----
  Tensor x;              // fp32 [B, in_dim]
  Tensor targets_f32;    // fp32 [B, out_dim] (regression)

  // The values of ids, pos and targets on the host, as the data pipeline made them
  // (each empty where the tensor is undefined). The step's checks and index work read
  // these, so a step does not wait for the device to learn what it uploaded. nullptr
  // for a batch assembled from tensors alone: the ops then read the device.
  struct HostIndex {
    std::vector<int32_t> ids, pos, targets;
  };
  std::shared_ptr<const HostIndex> host;

  int64_t rows() const;     // B
  int64_t seq_len() const;  // T (0 for the MLP)
  Batch slice(int64_t begin, int64_t end) const;  // rows [begin, end)
  // Keeps the host values the integer tensors were uploaded from.
  void keep_host_index(std::vector<int32_t> ids, std::vector<int32_t> pos, std::vector<int32_t> targets);
  // The host copies, or nullptr where there is none.
  const std::vector<int32_t>* host_ids() const { return host && ids.defined() ? &host->ids : nullptr; }
  const std::vector<int32_t>* host_pos() const { return host && pos.defined() ? &host->pos : nullptr; }
  const std::vector<int32_t>* host_targets() const {
    return host && targets.defined() ? &host->targets : nullptr;
  }
};

}  // namespace hr
