// PK-1 / PK-2: packing is exact. Variable-length sequences are packed first-fit
// decreasing (harness/data/packing.hpp) and compared with the same sequences run
// one per row, padded (each row alone), under the loss divided by real tokens:
// - the whole batch: loss and every gradient tensor;
// - each sequence of the row holding the most sequences, isolated by keeping only
//   its targets in the packed row, against that sequence run on its own (a row of
//   exactly its length): its loss and its gradient contribution.
// The check's error is the largest norm-wise relative error of all of them.
// Controls (the same check): the rows without the boundary mask and with positions
// running on across the row (PK-2, gross: later sequences see earlier ones, or
// read and train other rows of the position table), and the normaliser counting m
// tokens that carry no target (subtle: error m / (N + m), N real tokens).
#include "harness/properties/packing.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "harness/check.hpp"
#include "harness/data/packing.hpp"
#include "harness/data/synthetic.hpp"
#include "harness/properties/accum_support.hpp"
#include "harness/step/train_step.hpp"
#include "harness/tolerances.hpp"
#include "kernels/common/philox.hpp"

namespace hr::props {

StepConfig pk_config(DType dtype, bool memory_efficient) {
  StepConfig c;
  c.model = ModelKind::transformer;
  auto& t = c.transformer;
  t.vocab = 64;
  t.d_model = 32;
  t.heads = 1;
  t.layers = 2;
  t.max_positions = 64;
  t.dropout = 0.f;
  t.memory_efficient_attention = memory_efficient;
  c.seq_len = t.max_positions;
  c.batch = c.micro_batch = 1;
  c.precision.compute = dtype;
  c.loss_norm = LossNormalization::sum_div_window_items;
  c.optimizer.kind = OptimizerKind::sgd;
  return c;
}

StepConfig pk_bench_config(DType dtype, bool memory_efficient, Preset preset, int64_t seq_len) {
  StepConfig c = pk_config(dtype, memory_efficient);
  c.transformer.max_positions = c.seq_len = seq_len;
  if (preset == Preset::full) {
    c.transformer.d_model = 512;
    c.transformer.heads = 8;
    c.transformer.layers = 4;
    c.transformer.vocab = 32768;
  }
  return c;
}

TimingOptions pk_bench_timing(Preset preset) {
  TimingOptions timing;
  if (preset == Preset::quick) {
    timing.warmup = 1;
    timing.min_reps = kMinJudgedReps;
    timing.max_reps = kMinJudgedReps + 2;
    timing.min_total_s = 0.05;
  }
  return timing;
}

std::vector<int64_t> pk1_lengths(int64_t count, int64_t seq_len, uint64_t seed) {
  const int64_t lo = std::min<int64_t>(8, seq_len);
  std::vector<int64_t> out(static_cast<size_t>(count));
  for (size_t i = 0; i < out.size(); ++i)
    out[i] = lo + static_cast<int64_t>(philox_draw(seed ^ 0x5eedULL, i) % static_cast<uint64_t>(seq_len - lo + 1));
  return out;
}

PassResult run_fresh_pass(Device& dev, StepConfig cfg, const Batch& batch) {
  cfg.batch = cfg.micro_batch = batch.rows();
  TrainStep step(dev, cfg);
  PassResult r;
  r.loss = step.forward_backward(batch);
  r.grads = gradient_values(step);
  return r;
}

double pass_error(const PassResult& got, const PassResult& ref, const ZeroGradientRule& zero, nlohmann::json* details) {
  const double loss_rel = std::fabs(got.loss - ref.loss) / std::fabs(ref.loss);
  const TensorsCompare g = compare_tensors(got.grads, ref.grads, zero);
  *details = {{"loss_rel", json_number(loss_rel)}, {"grad_max_rel_l2", json_number(g.max_rel_l2)},
              {"worst_tensor", g.worst}};
  if (std::isnan(loss_rel) || std::isnan(g.max_rel_l2)) return NAN;
  return std::max(loss_rel, g.max_rel_l2);
}

namespace {

struct PackCompare {
  double error = 0;  // the largest relative error over losses and gradient tensors
  nlohmann::json details = nlohmann::json::object();
};

void fold(PackCompare& c, const std::string& what, const PassResult& got, const PassResult& ref,
          const ZeroGradientRule& zero) {
  const double e = pass_error(got, ref, zero, &c.details[what]);
  if (!(e <= c.error) && !std::isnan(c.error)) c.error = e;
}

// The row of the plan holding the most sequences, as a one-row plan.
PackPlan busiest_row(const PackPlan& plan) {
  std::vector<int64_t> count(static_cast<size_t>(plan.rows), 0);
  for (const PackedSequence& p : plan.placed) ++count[static_cast<size_t>(p.row)];
  const int64_t r = std::max_element(count.begin(), count.end()) - count.begin();
  PackPlan one;
  one.seq_len = plan.seq_len;
  one.rows = 1;
  one.row_fill = {plan.row_fill[static_cast<size_t>(r)]};
  for (PackedSequence p : plan.placed)
    if (p.row == r) {
      p.row = 0;
      one.placed.push_back(p);
    }
  return one;
}

}  // namespace

std::vector<Measurement> pk1_packing(Device& dev, DType dtype, Preset preset, uint64_t seed) {
  const int64_t count = preset == Preset::quick ? 48 : 96;
  std::vector<Measurement> out;
  for (bool eff : {false, true}) {
    StepConfig cfg = pk_config(dtype, eff);
    cfg.init_seed = seed;
    const std::vector<int64_t> lengths = pk1_lengths(count, cfg.seq_len, seed);
    const auto seqs = make_lm_sequences(cfg.transformer, lengths, seed + 1);
    const PackPlan plan = pack_first_fit_decreasing(lengths, cfg.seq_len);
    const PackPlan row = busiest_row(plan);
    const ZeroGradientRule zero = exact_zero_gradients(cfg);
    int64_t real = 0;
    for (int64_t len : lengths) real += len - 1;

    // References: every sequence alone (one per padded row), and each sequence of
    // the busiest row on its own.
    const PassResult alone_all = run_fresh_pass(dev, cfg, make_padded_batch(dev, cfg.transformer, seqs, cfg.seq_len));
    std::vector<PassResult> alone_one;
    for (const PackedSequence& p : row.placed)
      alone_one.push_back(run_fresh_pass(dev, cfg, make_padded_batch(dev, cfg.transformer, {seqs[static_cast<size_t>(p.index)]})));

    auto compare = [&](const StepConfig& c, const PackFaults& faults, bool per_sequence) {
      PackCompare r;
      fold(r, "batch", run_fresh_pass(dev, c, make_packed_batch(dev, c.transformer, plan, seqs, faults)), alone_all, zero);
      if (per_sequence)
        for (size_t i = 0; i < row.placed.size(); ++i) {
          const PackedSequence& p = row.placed[i];
          fold(r, fmt::format("sequence {} (offset {}, length {})", p.index, p.offset, p.length),
               run_fresh_pass(dev, c, make_packed_batch(dev, c.transformer, row, seqs, faults, p.index)), alone_one[i],
               zero);
        }
      return r;
    };
    const double tol = tol::kPackedRelL2(dtype);
    const char* impl = eff ? "memory_efficient" : "naive";
    auto fill = [&](Measurement& m, const PackCompare& c) {
      describe(m, dev, dtype, "transformer");
      // The rows the packing needs follow the seed's lengths: details, not config.
      m.config = {{"attention", impl}, {"seq_len", cfg.seq_len}, {"sequences", count}};
      m.metric = "max_rel_error";
      m.tolerance_reason = tol::kPackedReason;
      m.details = c.details;
      m.details["rows"] = plan.rows;
      m.details["real_tokens"] = real;
      m.details["pad_fraction"] = plan.pad_fraction();
      m.details["row_checked_sequences"] = row.placed.size();
    };
    {
      const PackCompare c = compare(cfg, {}, true);
      Measurement m = make_check("PK-1", "every packed sequence's loss and gradients equal those of running it alone",
                                 c.error, tol);
      fill(m, c);
      out.push_back(std::move(m));
    }
    {
      PackFaults f;
      f.no_segment_mask = true;
      const PackCompare c = compare(cfg, f, true);
      Measurement m = make_negative_control(
          "PK-2", "packed without the boundary mask: later sequences attend to earlier ones (PK-1's check)", c.error,
          tol, check_name("PK-1", "every packed sequence's loss and gradients equal those of running it alone"));
      fill(m, c);
      out.push_back(std::move(m));
    }
    {
      PackFaults f;
      f.positions_not_restarted = true;
      const PackCompare c = compare(cfg, f, true);
      Measurement m = make_negative_control(
          "PK-2", "positions not restarted: later sequences read and train other position rows (PK-1's check)",
          c.error, tol, check_name("PK-1", "every packed sequence's loss and gradients equal those of running it alone"));
      fill(m, c);
      out.push_back(std::move(m));
    }
    {
      const int64_t extra = tol::kPackedSubtleExtraTokens(dtype, static_cast<int64_t>(lengths.size()));
      // The step's normaliser switch: `extra` tokens without a target counted as real.
      StepConfig c = cfg;
      c.fault_extra_loss_items = extra;
      const PackCompare r = compare(c, {}, false);
      Measurement m = make_subtle_control(
          "PK-1",
          fmt::format("the real-token count includes {} tokens without a target ({})", extra,
                      extra == 1 ? "off by one" : "each sequence's last token"),
          r.error, tol, check_name("PK-1", "every packed sequence's loss and gradients equal those of running it alone"));
      fill(m, r);
      m.details["extra_tokens"] = extra;
      m.details["expected_error"] = static_cast<double>(extra) / static_cast<double>(real + extra);
      out.push_back(std::move(m));
    }
  }
  return out;
}

namespace {

HR_REGISTER_PROPERTY(PropertySpec{"PK-1", "a packed sequence trains as if alone; no boundary mask or no restarted "
                                          "positions is caught (PK-2)",
                                  2.0, [](RunContext& c) { return every_float_dtype(c, pk1_packing); }, ""});

}  // namespace
}  // namespace hr::props
