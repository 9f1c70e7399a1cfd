// Packing and padding of variable-length sequences (see packing.hpp).
#include "harness/data/packing.hpp"

#include <algorithm>
#include <numeric>
#include <utility>

#include "harness/check.hpp"
#include "harness/faults.hpp"
#include "kernels/common/philox.hpp"

HR_DEFINE_FAULT_SLOT(hr::PackerFault)

namespace hr {

int64_t PackPlan::real_tokens() const { return std::accumulate(row_fill.begin(), row_fill.end(), int64_t{0}); }

double PackPlan::pad_fraction() const {
  const double slots = static_cast<double>(rows * seq_len);
  return slots > 0 ? 1.0 - static_cast<double>(real_tokens()) / slots : 0.0;
}

PackPlan pack_first_fit_decreasing(const std::vector<int64_t>& lengths, int64_t seq_len, int64_t max_rows) {
  HR_ARG_CHECK(seq_len > 0, "packing: seq_len must be positive, got {}", seq_len);
  const PackerFault fault = faults::active<PackerFault>() ? *faults::active<PackerFault>() : PackerFault::none;
  const bool arrival = fault == PackerFault::next_fit_arrival;
  // The broken buffered packer packs each kPackerFaultBuffer sequences into rows of their own.
  const size_t chunk = fault == PackerFault::buffered ? kPackerFaultBuffer : std::max<size_t>(lengths.size(), 1);
  std::vector<size_t> order(lengths.size());
  std::iota(order.begin(), order.end(), 0);
  PackPlan plan;
  plan.seq_len = seq_len;
  for (size_t c0 = 0; c0 < order.size(); c0 += chunk) {
    const auto first = order.begin() + static_cast<std::ptrdiff_t>(c0);
    const auto last = order.begin() + static_cast<std::ptrdiff_t>(std::min(order.size(), c0 + chunk));
    if (!arrival) std::stable_sort(first, last, [&](size_t a, size_t b) { return lengths[a] > lengths[b]; });
    const size_t first_row = plan.row_fill.size();
    for (auto it = first; it != last; ++it) {
      const size_t s = *it;
      const int64_t len = lengths[s];
      HR_ARG_CHECK(len >= 1 && len <= seq_len, "packing: sequence {} has length {} outside [1, {}]", s, len, seq_len);
      size_t r = arrival && !plan.row_fill.empty() ? plan.row_fill.size() - 1 : first_row;
      while (r < plan.row_fill.size() && plan.row_fill[r] + len > seq_len) ++r;
      if (r == plan.row_fill.size()) {
        HR_ARG_CHECK(max_rows <= 0 || static_cast<int64_t>(r) < max_rows,
                     "packing: the sequences do not fit into {} rows of {} tokens", max_rows, seq_len);
        plan.row_fill.push_back(0);
      }
      plan.placed.push_back(PackedSequence{static_cast<int64_t>(s), static_cast<int64_t>(r), plan.row_fill[r], len});
      plan.row_fill[r] += len;
    }
  }
  plan.rows = static_cast<int64_t>(plan.row_fill.size());
  return plan;
}

Batch make_packed_batch(Device& dev, const TransformerConfig& cfg, const PackPlan& plan,
                        const std::vector<std::vector<int32_t>>& sequences, const PackFaults& faults_in,
                        int64_t only_sequence, int32_t pad_id) {
  const PackFaults faults = hr::faults::armed(faults_in);
  const int64_t rows = plan.rows, T = plan.seq_len;
  HR_ARG_CHECK(rows > 0 && static_cast<int64_t>(plan.row_fill.size()) == rows, "packed batch: a plan of {} rows", rows);
  const size_t n = static_cast<size_t>(rows * T);
  std::vector<int32_t> ids(n, pad_id), pos(n, 0), tgt(n, cfg.ignore_index), seg(n, 0);
  std::vector<int32_t> segments(static_cast<size_t>(rows), 0);
  for (const PackedSequence& p : plan.placed) {
    HR_ARG_CHECK(p.index >= 0 && p.index < static_cast<int64_t>(sequences.size()) &&
                     static_cast<int64_t>(sequences[static_cast<size_t>(p.index)].size()) == p.length,
                 "packed batch: sequence {} does not match its place in the plan", p.index);
    const std::vector<int32_t>& s = sequences[static_cast<size_t>(p.index)];
    const int32_t segment = segments[static_cast<size_t>(p.row)]++;
    const bool keep_targets = only_sequence < 0 || only_sequence == p.index;
    for (int64_t i = 0; i < p.length; ++i) {
      const size_t k = static_cast<size_t>(p.row * T + p.offset + i);
      ids[k] = s[static_cast<size_t>(i)];
      pos[k] = static_cast<int32_t>(faults.positions_not_restarted ? p.offset + i : i);
      seg[k] = segment;
      if (keep_targets && i + 1 < p.length) tgt[k] = s[static_cast<size_t>(i + 1)];
    }
  }
  // The unused tail of each row: padding in a segment of its own, positions restarting.
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = plan.row_fill[static_cast<size_t>(r)]; i < T; ++i) {
      const size_t k = static_cast<size_t>(r * T + i);
      seg[k] = segments[static_cast<size_t>(r)];
      pos[k] = static_cast<int32_t>(faults.positions_not_restarted ? i : i - plan.row_fill[static_cast<size_t>(r)]);
    }
  Batch out;
  out.ids = Tensor::from_host_i32(dev, ids, {rows, T}, Consumer::workspace);
  out.pos = Tensor::from_host_i32(dev, pos, {rows, T}, Consumer::workspace);
  out.targets = Tensor::from_host_i32(dev, tgt, {rows, T}, Consumer::workspace);
  if (!faults.no_segment_mask) out.segment_ids = Tensor::from_host_i32(dev, seg, {rows, T}, Consumer::workspace);
  out.keep_host_index(std::move(ids), std::move(pos), std::move(tgt));
  return out;
}

Batch make_padded_batch(Device& dev, const TransformerConfig& cfg, const std::vector<std::vector<int32_t>>& sequences,
                        int64_t seq_len, int32_t pad_id) {
  HR_ARG_CHECK(!sequences.empty(), "padded batch: no sequences");
  int64_t longest = 0;
  for (const auto& s : sequences) longest = std::max<int64_t>(longest, static_cast<int64_t>(s.size()));
  const int64_t T = seq_len > 0 ? seq_len : longest;
  HR_ARG_CHECK(longest <= T, "padded batch: a sequence of {} tokens in rows of {}", longest, T);
  const int64_t rows = static_cast<int64_t>(sequences.size());
  const size_t n = static_cast<size_t>(rows * T);
  std::vector<int32_t> ids(n, pad_id), pos(n), tgt(n, cfg.ignore_index), valid(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    const std::vector<int32_t>& s = sequences[static_cast<size_t>(r)];
    const int64_t len = static_cast<int64_t>(s.size());
    valid[static_cast<size_t>(r)] = static_cast<int32_t>(len);
    for (int64_t i = 0; i < T; ++i) {
      const size_t k = static_cast<size_t>(r * T + i);
      pos[k] = static_cast<int32_t>(i);
      if (i < len) ids[k] = s[static_cast<size_t>(i)];
      if (i + 1 < len) tgt[k] = s[static_cast<size_t>(i + 1)];
    }
  }
  Batch out;
  out.ids = Tensor::from_host_i32(dev, ids, {rows, T}, Consumer::workspace);
  out.pos = Tensor::from_host_i32(dev, pos, {rows, T}, Consumer::workspace);
  out.targets = Tensor::from_host_i32(dev, tgt, {rows, T}, Consumer::workspace);
  out.key_valid_len = Tensor::from_host_i32(dev, valid, {rows}, Consumer::workspace);
  out.keep_host_index(std::move(ids), std::move(pos), std::move(tgt));
  return out;
}

namespace {

int64_t total_tokens(const std::vector<int64_t>& lengths) {
  return std::accumulate(lengths.begin(), lengths.end(), int64_t{0});
}

// Slots used when consecutive groups of batch_rows sequences are each padded to their longest.
int64_t padded_to_longest_slots(const std::vector<int64_t>& lengths, int64_t batch_rows) {
  int64_t slots = 0;
  for (size_t b = 0; b < lengths.size(); b += static_cast<size_t>(batch_rows)) {
    const size_t e = std::min(lengths.size(), b + static_cast<size_t>(batch_rows));
    const int64_t longest = *std::max_element(lengths.begin() + static_cast<std::ptrdiff_t>(b),
                                               lengths.begin() + static_cast<std::ptrdiff_t>(e));
    slots += longest * static_cast<int64_t>(e - b);
  }
  return slots;
}

double pad_fraction_of(int64_t real, int64_t slots) {
  return slots > 0 ? 1.0 - static_cast<double>(real) / static_cast<double>(slots) : 0.0;
}

}  // namespace

double pad_fraction_pad_to_max(const std::vector<int64_t>& lengths, int64_t seq_len) {
  return pad_fraction_of(total_tokens(lengths), seq_len * static_cast<int64_t>(lengths.size()));
}

double pad_fraction_pad_to_longest(const std::vector<int64_t>& lengths, int64_t batch_rows) {
  HR_ARG_CHECK(batch_rows > 0, "pad to longest: batch_rows must be positive, got {}", batch_rows);
  return pad_fraction_of(total_tokens(lengths), padded_to_longest_slots(lengths, batch_rows));
}

std::vector<std::vector<int64_t>> bucketed_batches(const std::vector<int64_t>& lengths, int64_t seq_len,
                                                   int64_t batch_rows, int64_t buckets, uint64_t seed) {
  HR_ARG_CHECK(batch_rows > 0 && buckets > 0 && seq_len > 0, "bucketing: batch_rows, buckets and seq_len must be "
               "positive, got {}, {}, {}", batch_rows, buckets, seq_len);
  std::vector<std::vector<int64_t>> bucket(static_cast<size_t>(buckets));
  for (size_t i = 0; i < lengths.size(); ++i) {
    const int64_t len = lengths[i];
    HR_ARG_CHECK(len >= 1 && len <= seq_len, "bucketing: length {} outside [1, {}]", len, seq_len);
    bucket[static_cast<size_t>((len - 1) * buckets / seq_len)].push_back(static_cast<int64_t>(i));
  }
  std::vector<std::vector<int64_t>> out;
  uint64_t draw = 0;
  for (std::vector<int64_t>& b : bucket) {
    for (int64_t i = static_cast<int64_t>(b.size()) - 1; i > 0; --i) {  // Fisher-Yates on Philox draws
      const int64_t j = static_cast<int64_t>(philox_draw(seed, draw++) % static_cast<uint64_t>(i + 1));
      std::swap(b[static_cast<size_t>(i)], b[static_cast<size_t>(j)]);
    }
    for (size_t k = 0; k < b.size(); k += static_cast<size_t>(batch_rows))
      out.emplace_back(b.begin() + static_cast<std::ptrdiff_t>(k),
                       b.begin() + static_cast<std::ptrdiff_t>(std::min(b.size(), k + static_cast<size_t>(batch_rows))));
  }
  return out;
}

double pad_fraction_bucketed(const std::vector<int64_t>& lengths, int64_t seq_len, int64_t batch_rows,
                             int64_t buckets, uint64_t seed) {
  int64_t slots = 0;
  for (const std::vector<int64_t>& b : bucketed_batches(lengths, seq_len, batch_rows, buckets, seed)) {
    int64_t longest = 0;
    for (int64_t i : b) longest = std::max(longest, lengths[static_cast<size_t>(i)]);
    slots += longest * static_cast<int64_t>(b.size());
  }
  return pad_fraction_of(total_tokens(lengths), slots);
}

double pad_fraction_packed(const std::vector<int64_t>& lengths, int64_t seq_len) {
  return pack_first_fit_decreasing(lengths, seq_len).pad_fraction();
}

}  // namespace hr
