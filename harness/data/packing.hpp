// Sequence packing and padding as a data-pipeline step (field guide section 05):
// variable-length sequences laid into rows of seq_len tokens, either one per row
// padded (to the maximum, to the longest of its batch, or after bucketing by
// length) or packed first-fit decreasing, several per row, with positions
// restarting at each sequence and segment ids for the block-diagonal causal mask.
// The loss then counts real tokens only (targets of padding are ignore_index;
// TrainStep's sum_div_window_items divides by them, GA-4), so a packed sequence
// trains as if it ran alone (PK-1). Pad-token fractions per strategy are PK-3's.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "harness/data/batch.hpp"
#include "harness/faults.hpp"
#include "harness/models/presets.hpp"

namespace hr {

// Where first-fit decreasing put each sequence.
struct PackedSequence {
  int64_t index = 0;   // into the lengths given
  int64_t row = 0;
  int64_t offset = 0;  // first token's column in its row
  int64_t length = 0;
};

struct PackPlan {
  int64_t seq_len = 0;
  int64_t rows = 0;
  std::vector<PackedSequence> placed;  // in placement order (longest first)
  std::vector<int64_t> row_fill;       // real tokens per row
  int64_t real_tokens() const;
  double pad_fraction() const;         // pad slots / (rows * seq_len)
};

// First-fit decreasing: sequences sorted by length (longest first, ties in input
// order), each into the first row with room, a new row when none has. Every
// length must lie in [1, seq_len]. max_rows > 0: throws when more are needed.
PackPlan pack_first_fit_decreasing(const std::vector<int64_t>& lengths, int64_t seq_len, int64_t max_rows = 0);

// Wrong on purpose (PK-3's controls; a switch family of harness/faults.hpp, set for
// a scope): a buffered packer that packs each kPackerFaultBuffer sequences into rows
// of their own, so every buffer leaves its last rows partly empty (subtle), or next
// fit in arrival order, which only ever tries its newest row (gross).
enum class PackerFault : uint8_t { none, buffered, next_fit_arrival };
inline constexpr size_t kPackerFaultBuffer = 512;
using ScopedPackerFault = faults::Scoped<PackerFault>;

// Wrong on purpose (PK-2's controls): packed rows without the boundary mask
// (sequences attend to the ones before them in the row) or with positions that
// run on across the row instead of restarting at each sequence.
struct PackFaults {
  bool no_segment_mask = false;
  bool positions_not_restarted = false;
};

// The packed rows of `plan` holding `sequences` (plan.placed[i].index indexes
// them): ids, restarted positions, segment ids (the row's unused tail is padding
// in a segment of its own), next-token targets with ignore_index at each
// sequence's last token and on padding. only_sequence >= 0 keeps the targets of
// that sequence alone (its loss and gradient contribution in the packed row).
Batch make_packed_batch(Device& dev, const TransformerConfig& cfg, const PackPlan& plan,
                        const std::vector<std::vector<int32_t>>& sequences, const PackFaults& faults = {},
                        int64_t only_sequence = -1, int32_t pad_id = 0);

// One sequence per row, padded to seq_len (key_valid_len marks the padding; every
// row then runs alone). seq_len = 0: the longest sequence's length.
Batch make_padded_batch(Device& dev, const TransformerConfig& cfg, const std::vector<std::vector<int32_t>>& sequences,
                        int64_t seq_len = 0, int32_t pad_id = 0);

// ---- PK-3: fraction of pad tokens per strategy ----------------------------------
// Sequences in the given (already shuffled) order, batches of batch_rows rows.
// pad-to-max: every row holds seq_len slots.
double pad_fraction_pad_to_max(const std::vector<int64_t>& lengths, int64_t seq_len);
// pad-to-longest: each batch of batch_rows consecutive sequences padded to its longest.
double pad_fraction_pad_to_longest(const std::vector<int64_t>& lengths, int64_t batch_rows);
// Length bucketing: sequences go to `buckets` equal-width length ranges of
// [1, seq_len], are shuffled inside their bucket (Philox, seed) and batched
// there, each batch padded to its longest.
// The batches themselves: sequence indices per batch, bucket by bucket.
std::vector<std::vector<int64_t>> bucketed_batches(const std::vector<int64_t>& lengths, int64_t seq_len,
                                                   int64_t batch_rows, int64_t buckets, uint64_t seed);
double pad_fraction_bucketed(const std::vector<int64_t>& lengths, int64_t seq_len, int64_t batch_rows,
                             int64_t buckets, uint64_t seed);
// Packing: first-fit decreasing into rows of seq_len.
double pad_fraction_packed(const std::vector<int64_t>& lengths, int64_t seq_len);

}  // namespace hr

HR_DECLARE_FAULT_SLOT(hr::PackerFault);
