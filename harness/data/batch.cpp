// Batch row slicing.
#include "harness/data/batch.hpp"

#include "harness/check.hpp"

#include <utility>

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
  if (host) {
    // Each host vector holds its rows back to back: the slice is a contiguous range.
    const auto rows_of = [&](const std::vector<int32_t>& v) {
      if (v.empty()) return std::vector<int32_t>{};
      const size_t per_row = v.size() / static_cast<size_t>(rows());
      return std::vector<int32_t>(v.begin() + static_cast<std::ptrdiff_t>(per_row * static_cast<size_t>(begin)),
                                  v.begin() + static_cast<std::ptrdiff_t>(per_row * static_cast<size_t>(end)));
    };
    b.keep_host_index(rows_of(host->ids), rows_of(host->pos), rows_of(host->targets));
  }
  return b;
}

void Batch::keep_host_index(std::vector<int32_t> host_ids, std::vector<int32_t> host_pos,
                            std::vector<int32_t> host_targets) {
  const auto check = [](const Tensor& t, const std::vector<int32_t>& v, const char* what) {
    HR_CHECK(t.defined() ? static_cast<int64_t>(v.size()) == t.numel() : v.empty(),
             "batch: {} host values for {} {}", v.size(), what, t.defined() ? t.str() : "(undefined)");
  };
  check(ids, host_ids, "ids");
  check(pos, host_pos, "pos");
  check(targets, host_targets, "targets");
  auto h = std::make_shared<HostIndex>();
  h->ids = std::move(host_ids);
  h->pos = std::move(host_pos);
  h->targets = std::move(host_targets);
  host = std::move(h);
}

}  // namespace hr
