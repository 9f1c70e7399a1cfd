// The packing step (harness/data/packing.hpp): first-fit decreasing placement,
// positions restarting at each sequence, segment ids, real-token counts, and the
// pad-token fractions PK-3 reports, each against a count done by hand here.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>

#include "harness/check.hpp"
#include "harness/data/packing.hpp"
#include "harness/data/synthetic.hpp"
#include "harness/properties/packing.hpp"
#include "harness/properties/seq_length.hpp"
#include "harness/step/train_step.hpp"
#include "suites/common/property_check.hpp"
#include "suites/common/test_support.hpp"

namespace {

using namespace hr;

TEST(Packing, FirstFitDecreasingPlacesLongestFirstIntoTheFirstRowWithRoom) {
  // Sorted: 7 6 5 4 3 2 (row 10). 7 -> r0 (7), 6 -> r1 (6), 5 -> r2 (5), 4 -> r1 (10),
  // 3 -> r0 (10), 2 -> r2 (7).
  const PackPlan p = pack_first_fit_decreasing({3, 7, 2, 5, 6, 4}, 10);
  ASSERT_EQ(p.rows, 3);
  EXPECT_EQ(p.row_fill, (std::vector<int64_t>{10, 10, 7}));
  const std::vector<std::pair<int64_t, int64_t>> want = {{1, 0}, {4, 1}, {3, 2}, {5, 1}, {0, 0}, {2, 2}};  // (index, row)
  ASSERT_EQ(p.placed.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(p.placed[i].index, want[i].first) << i;
    EXPECT_EQ(p.placed[i].row, want[i].second) << i;
  }
  EXPECT_EQ(p.placed[3].offset, 6);  // 4 after the 6 in row 1
  EXPECT_EQ(p.placed[4].offset, 7);  // 3 after the 7 in row 0
  EXPECT_EQ(p.real_tokens(), 27);
  EXPECT_DOUBLE_EQ(p.pad_fraction(), 3.0 / 30.0);
  EXPECT_THROW(pack_first_fit_decreasing({3, 7, 2, 5, 6, 4}, 10, 2), InvalidArgument);
  EXPECT_THROW(pack_first_fit_decreasing({11}, 10), InvalidArgument);
  EXPECT_THROW(pack_first_fit_decreasing({0}, 10), InvalidArgument);
}

TEST(Packing, RowsRestartPositionsSeparateSegmentsAndCountRealTokens) {
  HR_TEST_DEVICE(dev, BackendKind::cpu);
  TransformerConfig cfg;
  const std::vector<int64_t> lengths = {5, 9, 3, 6, 2};
  const auto seqs = make_lm_sequences(cfg, lengths, 3);
  const PackPlan plan = pack_first_fit_decreasing(lengths, 12);
  const Batch b = make_packed_batch(dev, cfg, plan, seqs);
  const auto ids = b.ids.to_host_i32(), pos = b.pos.to_host_i32(), seg = b.segment_ids.to_host_i32(),
             tg = b.targets.to_host_i32();
  for (const PackedSequence& p : plan.placed) {
    const auto& s = seqs[static_cast<size_t>(p.index)];
    for (int64_t i = 0; i < p.length; ++i) {
      const size_t k = static_cast<size_t>(p.row * 12 + p.offset + i);
      EXPECT_EQ(ids[k], s[static_cast<size_t>(i)]);
      EXPECT_EQ(pos[k], i);
      EXPECT_EQ(tg[k], i + 1 < p.length ? s[static_cast<size_t>(i + 1)] : cfg.ignore_index);
      if (i > 0) EXPECT_EQ(seg[k], seg[k - 1]);
      else if (p.offset > 0) EXPECT_NE(seg[k], seg[k - 1]);  // a boundary inside a row
    }
  }
  int64_t real = 0;
  for (int32_t t : tg) real += t != cfg.ignore_index;
  EXPECT_EQ(real, (5 - 1) + (9 - 1) + (3 - 1) + (6 - 1) + (2 - 1));
  EXPECT_EQ(real, plan.real_tokens() - static_cast<int64_t>(lengths.size()));

  // One sequence's targets alone; the faults PK-2 runs.
  const Batch one = make_packed_batch(dev, cfg, plan, seqs, {}, 1);
  int64_t kept = 0;
  for (int32_t t : one.targets.to_host_i32()) kept += t != cfg.ignore_index;
  EXPECT_EQ(kept, 9 - 1);
  PackFaults f;
  f.no_segment_mask = true;
  f.positions_not_restarted = true;
  const Batch bad = make_packed_batch(dev, cfg, plan, seqs, f);
  EXPECT_FALSE(bad.segment_ids.defined());
  const auto bad_pos = bad.pos.to_host_i32();
  for (size_t k = 0; k < bad_pos.size(); ++k) EXPECT_EQ(bad_pos[k], static_cast<int32_t>(k % 12));
}

TEST(Packing, PaddedRowsHoldOneSequenceEach) {
  HR_TEST_DEVICE(dev, BackendKind::cpu);
  TransformerConfig cfg;
  const auto seqs = make_lm_sequences(cfg, {4, 7}, 5);
  const Batch b = make_padded_batch(dev, cfg, seqs);
  EXPECT_EQ(b.seq_len(), 7);
  EXPECT_EQ(b.key_valid_len.to_host_i32(), (std::vector<int32_t>{4, 7}));
  const auto tg = b.targets.to_host_i32();
  EXPECT_EQ(std::count_if(tg.begin(), tg.end(), [&](int32_t t) { return t != cfg.ignore_index; }), 3 + 6);
  EXPECT_THROW(make_padded_batch(dev, cfg, seqs, 5), InvalidArgument);
}

TEST(Packing, PadFractionsPerStrategy) {
  const std::vector<int64_t> lengths = {2, 8, 3, 7};  // 20 real tokens
  EXPECT_DOUBLE_EQ(pad_fraction_pad_to_max(lengths, 10), 1.0 - 20.0 / 40.0);
  EXPECT_DOUBLE_EQ(pad_fraction_pad_to_longest(lengths, 2), 1.0 - 20.0 / (2 * 8 + 2 * 7));
  // Buckets [1, 5] and [6, 10]: {2, 3} -> 2 x 3, {8, 7} -> 2 x 8, whatever the shuffle.
  EXPECT_DOUBLE_EQ(pad_fraction_bucketed(lengths, 10, 2, 2, 9), 1.0 - 20.0 / (6 + 16));
  // Packed: 8+2 | 7+3 -> two full rows.
  EXPECT_DOUBLE_EQ(pad_fraction_packed(lengths, 10), 0.0);
  EXPECT_THROW(pad_fraction_bucketed(lengths, 5, 2, 2, 9), InvalidArgument);
}

// PK-1 / PK-2 in fp32 on the CPU: both attention forms pass, and each form's three
// controls (no boundary mask, positions running on, the real-token count off by
// one) are caught by the same check.
TEST(PackingProperties, PackedSequencesTrainAsIfAloneAndTheFaultsAreCaught) {
  HR_TEST_DEVICE(dev, BackendKind::cpu);
  const std::vector<Measurement> ms = props::pk1_packing(dev, DType::f32, Preset::quick, 1234);
  test::expect_all_passed(ms, 8, 6);
  for (const Measurement& m : ms)
    if (m.control == "subtle") {
      ASSERT_TRUE(m.power.has_value());
      EXPECT_GT(*m.power, 10.0) << test::describe(m);  // one token in ~1700: ~60x the bound
    }
}

// PK-4 in the model: the forms agree, and the pass peaks' exponents sit where the
// T x T probabilities (naive) and their absence (memory-efficient) put them.
TEST(PackingProperties, MemoryEfficientAttentionAgreesAndScalesLinearly) {
  HR_TEST_DEVICE(dev, BackendKind::cpu);
  const std::vector<Measurement> ms = props::pk4_attention(dev, DType::f32, Preset::quick, 1234);
  test::expect_all_passed(ms, 7, 4);
  const std::vector<SweepPoint> pts = props::pk4_seq_sweep(dev, DType::f32, Preset::quick, 1234);
  ASSERT_EQ(pts.size(), 8u);
  for (const SweepPoint& p : pts) {
    ASSERT_EQ(p.status, "ok");
    EXPECT_TRUE(p.config.contains("seq_len") && p.config.contains("attention"));  // what the report's chart reads
  }
}

}  // namespace
