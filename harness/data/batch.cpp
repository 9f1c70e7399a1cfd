// Batch row slicing.
#include "harness/data/batch.hpp"

#include "harness/check.hpp"

namespace hr {

int64_t Batch::rows() const {
  if (ids.defined()) return ids.dim(0);
  if (x.defined()) return x.dim(0);
  HR_CHECK(false, "empty batch");
  return 0;
}

int64_t Batch::seq_len() const { return ids.defined() ? ids.dim(1) : 0; }

Batch Batch::slice(int64_t begin, int64_t end) const {
  auto s = [&](const Tensor& t) { return t.defined() ? t.slice(begin, end) : Tensor(); };
  Batch b;
  b.ids = s(ids);
  b.pos = s(pos);
  b.targets = s(targets);
  b.key_valid_len = s(key_valid_len);
  b.segment_ids = s(segment_ids);
  b.x = s(x);
  b.targets_f32 = s(targets_f32);
  return b;
}

}  // namespace hr
