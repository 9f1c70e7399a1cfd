// Embedding scalar math shared by both backends, and the host-built inverse index
// that makes the backward deterministic without atomics: the tokens of each id in
// increasing token order, so every backend sums a row's gradient in the same order.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/common/hd.hpp"

namespace hr::ops::emb {

HR_HD float combine(float token_row, float position_row) { return token_row + position_row; }

// CSR over the distinct ids that occur: ids[k] occurs at tokens[offsets[k] .. offsets[k+1]).
struct InverseIndex {
  std::vector<int32_t> ids;
  std::vector<int32_t> offsets;
  std::vector<int32_t> tokens;
};

// Counting sort by id (stable, so tokens stay in increasing order). `ids` are
// already checked to lie in [0, num_ids).
inline InverseIndex build_inverse_index(const std::vector<int32_t>& ids, int64_t num_ids) {
  std::vector<int32_t> count(static_cast<size_t>(num_ids) + 1, 0);
  for (int32_t v : ids) ++count[static_cast<size_t>(v) + 1];
  for (size_t v = 1; v < count.size(); ++v) count[v] += count[v - 1];  // count[v] = first slot of v
  InverseIndex ix;
  ix.tokens.resize(ids.size());
  std::vector<int32_t> next(count.begin(), count.end() - 1);
  for (size_t i = 0; i < ids.size(); ++i) ix.tokens[static_cast<size_t>(next[static_cast<size_t>(ids[i])]++)] =
      static_cast<int32_t>(i);
  for (int64_t v = 0; v < num_ids; ++v)
    if (count[static_cast<size_t>(v) + 1] > count[static_cast<size_t>(v)]) {
      ix.ids.push_back(static_cast<int32_t>(v));
      ix.offsets.push_back(count[static_cast<size_t>(v)]);
    }
  ix.offsets.push_back(static_cast<int32_t>(ids.size()));
  return ix;
}

}  // namespace hr::ops::emb
