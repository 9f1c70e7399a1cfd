// DP-1..DP-4 and BM-DP (see data_parallel.hpp). DP-1 compares N ranks x K
// micro-batches, all-reduced and divided once by the global real-item count, with a
// single-process full-batch step (another code path: no slicing, no collective, the
// step's own normalisation), on the accumulation properties' random data and
// within GA-1's bound. DP-4's controls are judged by DP-1's check. DP-2 compares
// the all-reduce once per window with one per micro-batch, and counts the bytes of
// each. DP-3 compares ZeRO-1 with the unsharded AdamW step, bitwise, and reads the
// optimizer-state bytes per rank from the memory tracker.
#include "harness/properties/data_parallel.hpp"
#include "harness/properties/sweep_support.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <optional>

#include "harness/check.hpp"
#include "harness/kernel_calls.hpp"
#include "harness/data/synthetic.hpp"
#include "harness/dist/dp_step.hpp"
#include "harness/properties/accum_support.hpp"
#include "harness/properties/dp_support.hpp"
#include "harness/step/memory_model.hpp"
#include "harness/tolerances.hpp"

namespace hr::props {
namespace {

using dist::Communicator;
using dist::DataParallelStep;
using dist::DpFault;
using dist::DpSync;

enum class Rows { full, padded };

struct Case {
  const char* model;
  Rows rows;
};

constexpr const char* kDp1Title =
    "N ranks x K micro-batches, all-reduced and divided once by the global real-item count, equal the single-process "
    "full batch";
constexpr const char* kDp2EveryTitle = "all-reduce after every micro-batch equals the single-process full batch";

const Case kCases[] = {{"mlp", Rows::full}, {"transformer", Rows::full}, {"transformer", Rows::padded}};

StepConfig case_config(const Case& c, int64_t micro_batch, Preset preset) {
  return std::string(c.model) == "mlp" ? accum_mlp_config(DType::f32, micro_batch, preset)
                                       : accum_transformer_config(DType::f32, micro_batch, preset);
}

// GA-4's long-tailed row lengths, so ranks hold different numbers of real tokens.
std::vector<int64_t> case_lengths(const Case& c, const StepConfig& cfg, uint64_t seed) {
  if (c.rows == Rows::full) return {};
  LengthDistribution dist;
  dist.max = cfg.seq_len;
  dist.p95 = cfg.seq_len * 3 / 4;
  dist.min = 2;
  return sample_lengths(dist, kEffectiveBatch, seed + 1);
}

std::string case_name(const Case& c) { return c.rows == Rows::padded ? "padded rows" : "full rows"; }

struct Reference {
  StepConfig cfg;
  Batch batch;
  NamedValues grads;
  ZeroGradientRule zero;
};

// The single-process full batch: one micro-batch of every row, the mean over its
// real items (TrainStep's own normalisation; no slicing, no collective).
Reference reference(Device& dev, const Case& c, Preset preset, uint64_t seed) {
  Reference r;
  r.cfg = case_config(c, kEffectiveBatch, preset);
  r.batch = accum_batch(dev, r.cfg, seed, case_lengths(c, r.cfg, seed));
  TrainStep full(dev, r.cfg);
  full.forward_backward(r.batch);
  r.grads = gradient_values(full);
  r.zero = exact_zero_gradients(r.cfg);
  return r;
}

struct DpGrads {
  NamedValues grads;
  dist::DpWindow window;
  std::vector<std::vector<std::string>> bucket_names;  // in all-reduce order
  dist::DpOptions options;
};

// How the checks run the step, as DDP runs it: buckets all-reduced inside the
// backward as soon as their gradients are final. The cap is a quarter of the model's
// gradient bytes (DDP's 25 MiB would hold a quick model whole), so every model runs
// in three or four buckets (a bucket closes at the cap or past it), some of them
// spanning two blocks.
dist::DpOptions bucketed(const StepConfig& cfg) {
  dist::DpOptions o;
  int64_t gradient_bytes = 0;
  for (int64_t n : trainable_tensor_sizes(cfg)) gradient_bytes += n * 4;
  o.bucket_bytes = std::max<int64_t>(gradient_bytes / 4, 1);
  o.overlap = true;
  return o;
}

// The comparison: one bucket of every gradient, all-reduced after the backward.
dist::DpOptions one_bucket_after_backward() {
  dist::DpOptions o;
  o.bucket_bytes = 0;
  o.overlap = false;
  return o;
}

DpGrads dp_gradients(Device& dev, Communicator& comm, const Case& c, int64_t micro_batch, Preset preset,
                     const Batch& batch, DpSync sync, DpFault fault, std::optional<dist::DpOptions> options = {}) {
  const StepConfig cfg = case_config(c, micro_batch, preset);
  DpGrads g;
  g.options = options ? *options : bucketed(cfg);
  DataParallelStep dp(dev, comm, cfg, sync, fault, g.options);
  g.window = dp.reduce_gradients(batch);
  g.grads = gradient_values(dp.local());
  g.bucket_names = dp.bucket_parameters();
  return g;
}

nlohmann::json dp_config(const Communicator& comm, const Case& c, int64_t micro_batch, DpSync sync) {
  const int64_t rows = kEffectiveBatch / comm.size();
  return nlohmann::json{{"ranks", comm.size()},
                        {"engine", comm.engine()},
                        {"global_batch", kEffectiveBatch},
                        {"rows_per_rank", rows},
                        {"micro_batch", micro_batch},
                        {"accum_steps_per_rank", rows / micro_batch},
                        {"rows", case_name(c)},
                        {"sync", sync == DpSync::once_per_window ? "once_per_window" : "every_micro_batch"}};
}

void fill(Measurement& m, const Device& dev, const Communicator& comm, const Case& c, int64_t micro_batch,
          DpSync sync) {
  describe(m, dev, DType::f32, c.model);
  m.config = dp_config(comm, c, micro_batch, sync);
  m.metric = "max_tensor_rel_l2 (max over ranks)";
  m.tolerance_reason = std::string(tol::kDataParallelReason);
}

// fill, and how the step bucketed and overlapped its all-reduces.
void fill(Measurement& m, const Device& dev, const Communicator& comm, const Case& c, int64_t micro_batch,
          DpSync sync, const DpGrads& g) {
  fill(m, dev, comm, c, micro_batch, sync);
  m.config["buckets"] = static_cast<int64_t>(g.bucket_names.size());
  m.config["overlap"] = g.options.overlap;
  m.details["bucket_bytes_cap"] = g.options.bucket_bytes;
  m.details["all_reduces"] = g.window.all_reduces;
  m.details["all_reduces_before_the_backward_ended"] = g.window.before_backward_end;
}

// This rank's error against the reference, then the largest over ranks.
double error_over_ranks(Device& dev, Communicator& comm, const NamedValues& got, const Reference& ref,
                        nlohmann::json* details) {
  const TensorsCompare cmp = compare_tensors(got, ref.grads, ref.zero);
  if (details) {
    (*details)["rank0_worst_tensor"] = cmp.worst;
    (*details)["rank0_global_rel_l2"] = json_number(cmp.global_rel_l2);
  }
  return max_over_ranks(comm, dev, cmp.max_rel_l2);
}

// Micro-batch sizes per rank: K = 2, and on the MLP (cheap) also K = rows per rank
// (micro-batches of one row).
std::vector<int64_t> dp_micro_batches(const Communicator& comm, const Case& c) {
  const int64_t rows = kEffectiveBatch / comm.size();
  std::vector<int64_t> out{rows / 2};
  if (rows / 2 != 1 && std::string(c.model) == "mlp") out.push_back(1);
  return out;
}

void dp1_dp4(Device& dev, Communicator& comm, Preset preset, uint64_t seed, const Reference& padded_ref,
             DpOutput& out) {
  const double tol = tol::kGradAccumRelL2(DType::f32);
  for (const Case& c : kCases) {
    const Reference ref = c.rows == Rows::padded ? padded_ref : reference(dev, c, preset, seed);
    for (int64_t mb : dp_micro_batches(comm, c)) {
      // Bucketed and overlapped, as DDP runs; on padded rows also one bucket after
      // the backward.
      std::vector<std::optional<dist::DpOptions>> ways{std::nullopt};
      if (c.rows == Rows::padded) ways.push_back(one_bucket_after_backward());
      for (const auto& way : ways) {
        const DpGrads g = dp_gradients(dev, comm, c, mb, preset, ref.batch, DpSync::once_per_window, DpFault::none, way);
        nlohmann::json d;
        const double e = error_over_ranks(dev, comm, g.grads, ref, &d);
        Measurement m = make_check("DP-1", kDp1Title, e, tol);
        m.details = d;
        fill(m, dev, comm, c, mb, DpSync::once_per_window, g);
        m.details["global_items"] = g.window.global_items;
        m.details["items_per_rank"] = gather_doubles(comm, dev, {g.window.local_items});
        out.measurements.push_back(std::move(m));
      }
    }
  }

  // DP-1's subtle control and DP-4's controls, on padded rows (ranks hold different
  // token counts), K = 2 per rank, judged by DP-1's check.
  const Case padded = kCases[2];
  const Reference& ref = padded_ref;
  const int64_t mb = dp_micro_batches(comm, padded).front();
  struct Control {
    const char* id;
    DpFault fault;
    bool subtle;
    const char* title;
    const char* reason;
  };
  const Control controls[] = {
      {"DP-1", DpFault::fp16_communication, true,
       "gradients all-reduced in fp16 (a compression hook) are flagged by DP-1's check", tol::kDataParallelSubtleReason},
      {"DP-4", DpFault::divide_by_n_twice, false, "dividing by N twice is flagged by DP-1's check", ""},
      {"DP-4", DpFault::skip_all_reduce_one_rank, false, "a rank that skips the all-reduce is flagged by DP-1's check",
       ""},
      {"DP-4", DpFault::local_item_count, false,
       "dividing by each rank's own real-token count instead of the global one is flagged by DP-1's check", ""},
      {"DP-4", DpFault::reduce_before_ready, false,
       "a bucket spanning two blocks all-reduced before the second block's backward is flagged by DP-1's check",
       tol::kDataParallelEarlyBucketReason},
  };
  for (const Control& k : controls) {
    const DpGrads g = dp_gradients(dev, comm, padded, mb, preset, ref.batch, DpSync::once_per_window, k.fault);
    nlohmann::json d;
    const double e = error_over_ranks(dev, comm, g.grads, ref, &d);
    const std::string of = check_name("DP-1", kDp1Title);
    Measurement m = k.subtle ? make_subtle_control(k.id, k.title, e, tol, of) : make_negative_control(k.id, k.title, e, tol, of);
    fill(m, dev, comm, padded, mb, DpSync::once_per_window, g);
    m.config["fault"] = dist::dp_fault_name(k.fault);
    m.details.update(d);
    if (*k.reason) m.details["fault"] = k.reason;
    out.measurements.push_back(std::move(m));
  }

  // DP-4's subtle control: one rank alone rounds to fp16 what it sends and what it
  // receives (one rank's compression hook), the one-rank form of DP-1's.
  const DpGrads g = dp_gradients(dev, comm, padded, mb, preset, ref.batch, DpSync::once_per_window,
                                 DpFault::fp16_one_rank);
  nlohmann::json d;
  const double e = error_over_ranks(dev, comm, g.grads, ref, &d);
  Measurement m = make_subtle_control("DP-4", "one rank rounding its all-reduce to fp16 is flagged by DP-1's check", e, tol,
                                      check_name("DP-1", kDp1Title));
  fill(m, dev, comm, padded, mb, DpSync::once_per_window, g);
  m.config["fault"] = dist::dp_fault_name(DpFault::fp16_one_rank);
  m.details.update(d);
  m.details["fault"] = tol::kDataParallelOneRankSubtleReason;
  out.measurements.push_back(std::move(m));
}

SweepPoint comm_point(const Communicator& comm, const Device& dev, const char* model, const std::string& sync,
                      int64_t micro_batches, const dist::CommStats& grads, const dist::CommStats& all,
                      int64_t parameters) {
  SweepPoint p = sweep_point("DP-COMM", dev, DType::f32, model,
                             {{"ranks", comm.size()}, {"engine", comm.engine()}, {"sync", sync},
                              {"micro_batches_per_rank", micro_batches}});
  p.metrics = {{"gradient_payload_bytes_per_step", grads.payload_bytes},
               {"gradient_bus_bytes_per_step", grads.bus_bytes},
               {"payload_bytes_per_step", all.payload_bytes},
               {"bus_bytes_per_step", all.bus_bytes},
               {"collectives_per_step", all.calls},
               {"trainable_parameters", parameters}};
  return p;
}

void dp2(Device& dev, Communicator& comm, Preset preset, const Reference& ref, DpOutput& out) {
  const double tol = tol::kGradAccumRelL2(DType::f32);
  const Case c = kCases[2];
  const int64_t mb = kEffectiveBatch / comm.size() / 4;  // K = 4 per rank
  const DpGrads once = dp_gradients(dev, comm, c, mb, preset, ref.batch, DpSync::once_per_window, DpFault::none);
  const DpGrads every = dp_gradients(dev, comm, c, mb, preset, ref.batch, DpSync::every_micro_batch, DpFault::none);
  const int64_t K = once.window.micro_batches;

  {
    nlohmann::json d;
    const double e = error_over_ranks(dev, comm, every.grads, ref, &d);
    Measurement m = make_check("DP-2", kDp2EveryTitle, e, tol);
    fill(m, dev, comm, c, mb, DpSync::every_micro_batch);
    m.details = d;
    out.measurements.push_back(std::move(m));
  }
  {
    const TensorsCompare cmp = compare_tensors(once.grads, every.grads, ref.zero);
    const double e = max_over_ranks(comm, dev, cmp.max_rel_l2);
    Measurement m = make_check("DP-2", "all-reduce once per window (no_sync) equals all-reduce after every micro-batch",
                               e, tol);
    fill(m, dev, comm, c, mb, DpSync::once_per_window);
    m.details["worst_tensor"] = cmp.worst;
    out.measurements.push_back(std::move(m));
    // Subtle, a switch of the data-parallel step: the once-per-window all-reduce in fp16.
    const DpGrads h = dp_gradients(dev, comm, c, mb, preset, ref.batch, DpSync::once_per_window,
                                   DpFault::fp16_communication);
    const double eh = max_over_ranks(comm, dev, compare_tensors(h.grads, every.grads, ref.zero).max_rel_l2);
    Measurement s = make_subtle_control(
        "DP-2", "a once-per-window all-reduce in fp16 is flagged", eh, tol,
        check_name("DP-2", "all-reduce once per window (no_sync) equals all-reduce after every micro-batch"));
    fill(s, dev, comm, c, mb, DpSync::once_per_window);
    s.config["fault"] = dist::dp_fault_name(DpFault::fp16_communication);
    out.measurements.push_back(std::move(s));
  }
  // Bytes, as this rank's receive buffers got them from the collective library (MPI's
  // profiling interface, or each NCCL call), not as the communicator counts its own
  // calls: K all-reduces of the whole gradient against one, so every-micro-batch
  // bytes are exactly K times once-per-window bytes. The error is in fp32 elements.
  const std::string bytes_title = "gradient bytes communicated per step: every micro-batch / once per window = K";
  auto bytes_error = [&](const DpGrads& once_run) {
    const double every_b = static_cast<double>(every.window.gradients_received.payload_bytes);
    const double once_b = static_cast<double>(once_run.window.gradients_received.payload_bytes);
    return max_over_ranks(comm, dev, std::fabs(every_b - static_cast<double>(K) * once_b) / 4.0);
  };
  auto bytes_details = [&](const DpGrads& once_run) {
    return nlohmann::json{
        {"K", K},
        {"gradient_bytes_received_once_per_window", once_run.window.gradients_received.payload_bytes},
        {"gradient_bytes_received_every_micro_batch", every.window.gradients_received.payload_bytes},
        {"gradient_all_reduces_received_once_per_window", once_run.window.gradients_received.calls},
        {"gradient_all_reduces_received_every_micro_batch", every.window.gradients_received.calls},
        {"communicator_payload_bytes_once_per_window", once_run.window.gradients.payload_bytes},
        {"communicator_payload_bytes_every_micro_batch", every.window.gradients.payload_bytes},
        {"gradient_bus_bytes_once_per_window", once_run.window.gradients.bus_bytes},
        {"gradient_bus_bytes_every_micro_batch", every.window.gradients.bus_bytes},
        {"counted_by", comm.engine() == "mpi" ? "MPI's profiling interface (PMPI)" : "each NCCL call"}};
  };
  {
    Measurement m = make_check("DP-2", bytes_title, bytes_error(once), tol::kBitwiseMismatches);
    fill(m, dev, comm, c, mb, DpSync::once_per_window);
    m.metric = "fp32 elements received: |every micro-batch - K x once per window|";
    m.tolerance_reason = "exact: the same all-reduce of every gradient element, K times or once (a count: under one)";
    m.details = bytes_details(once);
    out.measurements.push_back(std::move(m));
  }
  {  // Subtle: the once-per-window all-reduce one element short (K elements off).
    const DpGrads shortr = dp_gradients(dev, comm, c, mb, preset, ref.batch, DpSync::once_per_window,
                                        DpFault::once_one_element_short);
    Measurement s = make_subtle_control("DP-2", "a once-per-window all-reduce one element short is flagged",
                                        bytes_error(shortr), tol::kBitwiseMismatches, check_name("DP-2", bytes_title));
    fill(s, dev, comm, c, mb, DpSync::once_per_window);
    s.config["fault"] = dist::dp_fault_name(DpFault::once_one_element_short);
    s.metric = "fp32 elements received: |every micro-batch - K x once per window|";
    s.tolerance_reason = "exact (a count: under one)";
    s.details = bytes_details(shortr);
    out.measurements.push_back(std::move(s));
  }
  // Overlap: every bucket whose parameters all belong to blocks (the memory model's
  // layout, not the step's) is all-reduced from a block's backward hook, before the
  // backward ends. Gross control: every bucket held to the end; subtle: the last one of block
  // gradients (the first block's), one bucket late.
  {
    const StepConfig cfg = case_config(c, mb, preset);
    const std::vector<int64_t> blocks = parameter_tensor_blocks(cfg);
    HR_CHECK(blocks.size() == once.grads.size(), "DP-2: {} parameter blocks for {} gradients", blocks.size(),
             once.grads.size());
    std::map<std::string, int64_t> block_of;
    for (size_t i = 0; i < blocks.size(); ++i) block_of[once.grads[i].first] = blocks[i];
    const std::string title = "with overlap, every bucket of block gradients is all-reduced before the backward ends";
    auto late = [&](const DpGrads& g) {
      int64_t expected = 0;
      for (const auto& names : g.bucket_names)
        expected += std::all_of(names.begin(), names.end(), [&](const std::string& n) { return block_of.at(n) >= 0; });
      // As the library saw them (PMPI, or each NCCL call); the single engine has no
      // library, so there the step's own count.
      const double launched = comm.engine() == "single" ? static_cast<double>(g.window.before_backward_end)
                                                         : static_cast<double>(g.window.library_calls_before_backward_end);
      return max_over_ranks(comm, dev, std::fabs(static_cast<double>(expected) - launched));
    };
    auto record = [&](Measurement m, const DpGrads& g, DpFault f) {
      fill(m, dev, comm, c, mb, DpSync::once_per_window, g);
      m.metric = "buckets of block gradients all-reduced after the backward (max over ranks)";
      m.details["counted_by"] = comm.engine() == "mpi"    ? "MPI's profiling interface (PMPI)"
                                : comm.engine() == "nccl" ? "each NCCL call"
                                                          : "the step (one process: no collective library)";
      m.details["library_calls_before_the_backward_ended"] = g.window.library_calls_before_backward_end;
      // Left to run beside the rest of the backward: on a GPU (NCCL's own stream)
      // overlapped with its kernels; the host engines finish each call before returning.
      m.details["deferred_beside_the_backward"] = g.window.deferred;
      m.tolerance_reason = "exact: a count (under one)";
      if (f != DpFault::none) m.config["fault"] = dist::dp_fault_name(f);
      out.measurements.push_back(std::move(m));
    };
    record(make_check("DP-2", title, late(once), tol::kBitwiseMismatches), once, DpFault::none);
    const DpGrads all_late = dp_gradients(dev, comm, c, mb, preset, ref.batch, DpSync::once_per_window,
                                          DpFault::reduce_after_backward);
    record(make_negative_control("DP-2", "buckets all held to the end of the backward are flagged", late(all_late),
                                 tol::kBitwiseMismatches, check_name("DP-2", title)),
           all_late, DpFault::reduce_after_backward);
    const DpGrads first_late = dp_gradients(dev, comm, c, mb, preset, ref.batch, DpSync::once_per_window,
                                            DpFault::last_block_bucket_late);
    record(make_subtle_control("DP-2", "the last bucket of block gradients held to the end of the backward is flagged", late(first_late),
                               tol::kBitwiseMismatches, check_name("DP-2", title)),
           first_late, DpFault::last_block_bucket_late);
  }
  int64_t params = 0;
  for (const auto& [name, v] : ref.grads) params += static_cast<int64_t>(v.size());
  out.points.push_back(comm_point(comm, dev, c.model, "once_per_window", K, once.window.gradients, once.window.comm, params));
  out.points.push_back(
      comm_point(comm, dev, c.model, "every_micro_batch", K, every.window.gradients, every.window.comm, params));

  // Controls, judged by the first check: re-reducing the accumulated buffer after
  // every micro-batch (gross), and fp16 communication per micro-batch (subtle).
  for (const auto& [fault, subtle] : {std::pair{DpFault::reduce_accumulated, false}, std::pair{DpFault::fp16_communication, true}}) {
    const DpGrads g = dp_gradients(dev, comm, c, mb, preset, ref.batch, DpSync::every_micro_batch, fault);
    const double e = error_over_ranks(dev, comm, g.grads, ref, nullptr);
    const std::string title = subtle ? "every-micro-batch all-reduce in fp16 is flagged"
                                     : "re-reducing the accumulated gradient after every micro-batch is flagged";
    const std::string of = check_name("DP-2", kDp2EveryTitle);
    Measurement m = subtle ? make_subtle_control("DP-2", title, e, tol, of) : make_negative_control("DP-2", title, e, tol, of);
    fill(m, dev, comm, c, mb, DpSync::every_micro_batch);
    m.config["fault"] = dist::dp_fault_name(fault);
    out.measurements.push_back(std::move(m));
  }
}

void dp3(Device& dev, Communicator& comm, Preset preset, uint64_t seed, DpOutput& out, bool record_points) {
  const int64_t steps = 2;  // the second step reads the moments the first wrote
  // The MLP: sharding is element-wise, so one model (with and without weight decay
  // per tensor, shards crossing tensor boundaries) shows it.
  for (const Case& c : {kCases[0]}) {
    const int64_t mb = dp_micro_batches(comm, c).front();
    StepConfig adam = case_config(c, mb, preset);
    adam.optimizer = OptimizerConfig{};  // AdamW at its defaults
    const StepConfig probe = case_config(c, kEffectiveBatch, preset);
    const Batch batch = accum_batch(dev, probe, seed, case_lengths(c, probe, seed));

    // Unsharded: every rank holds all of AdamW's state and steps all of it.
    std::vector<NamedValues> unsharded;  // after each step
    size_t unsharded_state_bytes = 0;
    dist::CommStats unsharded_comm, unsharded_grads;
    {
      dev.memory().reset_peak();
      const MemorySnapshot before = dev.memory().snapshot();
      DataParallelStep dp(dev, comm, adam, DpSync::once_per_window);
      unsharded_state_bytes = dev.memory().snapshot().current(Consumer::optimizer_state) -
                              before.current(Consumer::optimizer_state);
      for (int64_t s = 1; s <= steps; ++s) {
        const dist::DpWindow w = dp.reduce_gradients(batch);
        unsharded_comm = w.comm;
        unsharded_grads = w.gradients;
        dp.local().optimizer().step(dp.local().params(), s);
        dp.local().params().sync_compute();
        unsharded.push_back(parameter_values(dp.local()));
      }
      if (record_points) mem_points(dev, comm, c.model, DType::f32, {{"optimizer", "adamw"}}, held_since(before, dev.memory().snapshot()), out);
    }

    // ZeRO-1, correct and broken.
    struct Variant {
      dist::ZeroFault fault;
      const char* kind;  // "check" | "gross" | "subtle"
      const char* title;
    };
    const Variant variants[] = {
        {dist::ZeroFault::none, "check", "ZeRO-1 (AdamW state sharded over the ranks) equals the unsharded step"},
        {dist::ZeroFault::skip_all_gather, "gross", "ZeRO-1 without the all-gather of parameters is flagged"},
        {dist::ZeroFault::shard_one_short, "subtle", "ZeRO-1 with every shard one element short is flagged"},
    };
    for (const Variant& v : variants) {
      StepConfig sgd = adam;
      sgd.optimizer.kind = OptimizerKind::sgd;  // plain SGD holds no state; it never steps here
      dev.memory().reset_peak();
      const MemorySnapshot before = dev.memory().snapshot();
      DataParallelStep dp(dev, comm, sgd, DpSync::once_per_window);
      const size_t before_opt = dev.memory().snapshot().current(Consumer::optimizer_state);
      dist::Zero1AdamW zero(dev, comm, dp.local().params(), adam.optimizer.adamw, v.fault);
      const size_t zero_state_bytes = dev.memory().snapshot().current(Consumer::optimizer_state) - before_opt;
      dist::CommStats step_comm, step_grads;
      std::vector<size_t> mismatches;  // after each step
      for (int64_t s = 1; s <= steps; ++s) {
        const dist::CommStats s0 = comm.stats();
        step_grads = dp.reduce_gradients(batch).gradients;
        zero.step(dp.local().params(), s);
        step_comm.calls = comm.stats().calls - s0.calls;
        step_comm.payload_bytes = comm.stats().payload_bytes - s0.payload_bytes;
        step_comm.bus_bytes = comm.stats().bus_bytes - s0.bus_bytes;
        mismatches.push_back(count_bitwise_mismatches(parameter_values(dp.local()), unsharded[static_cast<size_t>(s - 1)]));
      }
      // The check after each step (the second reads the moments the first wrote). A
      // control is judged after its first step: from then on the parameters differ,
      // so every later gradient does, and the count says nothing about the fault's size.
      for (int64_t s = 1; s <= (v.fault == dist::ZeroFault::none ? steps : 1); ++s) {
        const double worst =
            max_over_ranks(comm, dev, static_cast<double>(mismatches[static_cast<size_t>(s - 1)]));
        Measurement m = std::string(v.kind) == "check"   ? make_check("DP-3", v.title, worst, tol::kBitwiseMismatches)
                        : std::string(v.kind) == "gross" ? make_negative_control("DP-3", v.title, worst, tol::kBitwiseMismatches, check_name("DP-3", variants[0].title))
                                                         : make_subtle_control("DP-3", v.title, worst, tol::kBitwiseMismatches, check_name("DP-3", variants[0].title));
        describe(m, dev, DType::f32, c.model);
        m.config = dp_config(comm, c, mb, DpSync::once_per_window);
        m.config["optimizer"] = "adamw";
        m.config["zero_fault"] = dist::zero_fault_name(v.fault);
        m.config["after_step"] = s;
        m.metric = "parameter elements differing bitwise from the unsharded step (max over ranks)";
        m.tolerance_reason = "exact: AdamW is element-wise, so the shard's update runs the same kernel on the same "
                             "values as the unsharded step; the all-gather only copies";
        m.details = {{"parameters", zero.total_elements()}, {"shard_elements", zero.shard_elements()}};
        out.measurements.push_back(std::move(m));
      }
      if (v.fault != dist::ZeroFault::none) continue;

      if (record_points) {
        mem_points(dev, comm, c.model, DType::f32, {{"optimizer", "adamw_zero1"}}, held_since(before, dev.memory().snapshot()), out);
        int64_t params = zero.total_elements();
        out.points.push_back(comm_point(comm, dev, c.model, "zero1_step", dp.local().config().accum_steps(),
                                        step_grads, step_comm, params));
        out.points.push_back(comm_point(comm, dev, c.model, "unsharded_step", dp.local().config().accum_steps(),
                                        unsharded_grads, unsharded_comm, params));
      }

      // Optimizer-state bytes per rank, from the tracker: the rank holding the longest
      // shard holds ceil(P / N) elements' two fp32 moments, P read from the unsharded
      // state's bytes (8 per element), not from the partition. The error is in elements.
      const double unsharded_elements = static_cast<double>(unsharded_state_bytes) / 8.0;
      const double shard = std::ceil(unsharded_elements / comm.size());
      auto elements_off = [&](size_t rank_bytes) {
        return std::fabs(max_over_ranks(comm, dev, static_cast<double>(rank_bytes)) / 8.0 - shard);
      };
      // A ZeRO-1 with one of its faults, built only for its state's bytes.
      auto state_bytes_with = [&](dist::ZeroFault f) {
        const size_t before_fault = dev.memory().snapshot().current(Consumer::optimizer_state);
        dist::Zero1AdamW faulty(dev, comm, dp.local().params(), adam.optimizer.adamw, f);
        return dev.memory().snapshot().current(Consumer::optimizer_state) - before_fault;
      };
      const double worst_bytes = max_over_ranks(comm, dev, static_cast<double>(zero_state_bytes));
      const std::string bytes_title = "ZeRO-1 optimizer-state bytes per rank are 1/N of the unsharded state";
      Measurement b = make_check("DP-3", bytes_title, elements_off(zero_state_bytes), tol::kBitwiseMismatches);
      describe(b, dev, DType::f32, c.model);
      b.config = dp_config(comm, c, mb, DpSync::once_per_window);
      b.config["optimizer"] = "adamw";
      b.metric = "elements of state beyond or short of ceil(P / N) on the fullest rank";
      b.tolerance_reason = "exact: ceil(P / N) elements x two fp32 moments, P from the unsharded state's bytes";
      b.details = {{"optimizer_state_bytes_per_rank_zero1", worst_bytes},
                   {"optimizer_state_bytes_unsharded", unsharded_state_bytes},
                   {"share_of_unsharded_over_1_over_n",
                    worst_bytes / (static_cast<double>(unsharded_state_bytes) / comm.size())},
                   {"optimizer_state_bytes_per_rank_all",
                    gather_doubles(comm, dev, {static_cast<double>(zero_state_bytes)})}};
      // Its controls, from the tracker as the check reads it: every rank holding the
      // whole state (the sharding lost: gross), every shard one element short (subtle).
      const std::string bytes_check = check_name("DP-3", bytes_title);
      auto bytes_control = [&](dist::ZeroFault f, bool subtle, const char* title) {
        const size_t bytes = state_bytes_with(f);
        const double off = elements_off(bytes);
        Measurement m = subtle ? make_subtle_control("DP-3", title, off, tol::kBitwiseMismatches, bytes_check)
                               : make_negative_control("DP-3", title, off, tol::kBitwiseMismatches, bytes_check);
        describe(m, dev, DType::f32, c.model);
        m.config = b.config;
        m.config["zero_fault"] = dist::zero_fault_name(f);
        m.metric = b.metric;
        m.tolerance_reason = b.tolerance_reason;
        m.details = {{"optimizer_state_bytes_per_rank", max_over_ranks(comm, dev, static_cast<double>(bytes))},
                     {"optimizer_state_bytes_unsharded", unsharded_state_bytes}};
        return m;
      };
      Measurement g = bytes_control(
          dist::ZeroFault::whole_state, false,
          "ZeRO-1 whose every rank holds the whole optimizer state is flagged by the 1/N check");
      Measurement sc = bytes_control(dist::ZeroFault::shard_one_short, true,
                                     "ZeRO-1 with every shard one element short is flagged by the 1/N check");
      out.measurements.push_back(std::move(b));
      out.measurements.push_back(std::move(g));
      out.measurements.push_back(std::move(sc));
    }
  }
}

}  // namespace

DpPart parse_dp_part(const std::string& s) {
  if (s == "all") return DpPart::all;
  if (s == "data_parallel") return DpPart::data_parallel;
  if (s == "sharding") return DpPart::sharding;
  throw InvalidArgument(fmt::format("--part: '{}' (expected all, data_parallel or sharding)", s));
}

DpOutput dp_properties(Device& dev, Communicator& comm, Preset preset, uint64_t seed, DpPart part) {
  HR_ARG_CHECK(kEffectiveBatch % (2 * comm.size()) == 0, "DP: {} ranks do not divide the batch of {} into K >= 2",
               comm.size(), kEffectiveBatch);
  DpOutput out;
  if (part != DpPart::sharding) {
    const Reference padded_ref = reference(dev, kCases[2], preset, seed);
    dp1_dp4(dev, comm, preset, seed, padded_ref, out);
    dp2(dev, comm, preset, padded_ref, out);
    dp3(dev, comm, preset, seed, out, true);
  }
  if (part != DpPart::data_parallel) dp_sharding(dev, comm, preset, seed, out);
  return out;
}

std::vector<SweepPoint> bm_dp(Device& dev, Communicator& comm, Preset preset) {
  std::vector<SweepPoint> out;
  const int n = comm.size();
  const int reps = preset == Preset::quick ? 10 : 30, warmup = 3;
  // Fixed repetition counts on every rank (an adaptive count could differ between
  // ranks and leave one waiting in a collective); each sample is the slowest rank's.
  auto time_collective = [&](const std::function<void()>& fn) {
    std::vector<double> mine;
    KernelCalls calls0;  // before the timed repetitions (time_region records them so too)
    for (int i = 0; i < warmup + reps; ++i) {
      if (i == warmup) calls0 = kernel_calls();
      comm.barrier();
      const auto t0 = std::chrono::steady_clock::now();
      fn();
      comm.synchronize();
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (i >= warmup) mine.push_back(s);
    }
    const std::vector<double> all = gather_doubles(comm, dev, mine);
    std::vector<double> slowest(mine.size(), 0.0);
    for (int r = 0; r < n; ++r)
      for (size_t i = 0; i < mine.size(); ++i) slowest[i] = std::max(slowest[i], all[static_cast<size_t>(r) * mine.size() + i]);
    TimeStats t = summarize_times(slowest);
    t.kernel_calls = kernel_calls_per_run(calls0, kernel_calls(), static_cast<double>(mine.size()));
    return t;
  };

  const int64_t max_bytes = preset == Preset::quick ? (int64_t{16} << 20) : (int64_t{256} << 20);
  for (int64_t bytes = 4096; bytes <= max_bytes; bytes *= 4) {
    const size_t count = static_cast<size_t>(bytes / 4);
    std::vector<float> host(count, 1.f);
    Tensor dbuf;
    void* buf = host.data();
    if (comm.device_buffers()) {
      dbuf = Tensor::from_host(dev, host, {static_cast<int64_t>(count)}, DType::f32, Consumer::workspace);
      buf = dbuf.data();
    }
    SweepPoint p =
        sweep_point("BM-DP", dev, DType::f32, "op:all_reduce", {{"engine", comm.engine()}, {"ranks", n}, {"bytes", bytes}});
    p.time = time_collective([&] { comm.all_reduce_sum(buf, count, dist::CommDType::f32); });
    const double algbw = static_cast<double>(bytes) / p.time->median_s / 1e9;
    p.metrics = {{"algbw_GBps", algbw}, {"busbw_GBps", algbw * dist::all_reduce_bus_factor(n)},
                 {"definition", "nccl-tests: algbw = bytes / time; busbw = algbw x 2 (N - 1) / N"},
                 {"noisy", p.time->noisy}};
    out.push_back(std::move(p));
  }

  // The data-parallel step (forward, backward, all-reduce, divide; no optimizer) at
  // the fixed global batch: the time against N, bucketed and overlapped as DDP runs,
  // and with one bucket after the backward.
  const Case c = kCases[1];
  const int64_t mb = kEffectiveBatch / n / 2;
  const StepConfig cfg = case_config(c, mb, preset);
  const Batch batch = accum_batch(dev, case_config(c, kEffectiveBatch, preset), 99);
  for (const dist::DpOptions& o : {bucketed(cfg), one_bucket_after_backward()}) {
    DataParallelStep dp(dev, comm, cfg, DpSync::once_per_window, DpFault::none, o);
    SweepPoint s = sweep_point("BM-DP", dev, DType::f32, c.model,
                               {{"engine", comm.engine()}, {"ranks", n}, {"global_batch", kEffectiveBatch},
                                {"micro_batch", mb}, {"what", "data-parallel step (no optimizer)"},
                                {"buckets", static_cast<int64_t>(dp.bucket_parameters().size())},
                                {"overlap", o.overlap}});
    dist::CommStats step_comm;
    s.time = time_collective([&] { step_comm = dp.reduce_gradients(batch).comm; });
    s.metrics = {{"payload_bytes_per_step", step_comm.payload_bytes}, {"bus_bytes_per_step", step_comm.bus_bytes},
                 {"bucket_bytes_cap", o.bucket_bytes},
                 {"tokens_per_s", static_cast<double>(kEffectiveBatch * cfg.seq_len) / s.time->median_s},
                 {"noisy", s.time->noisy}};
    out.push_back(std::move(s));
  }
  return out;
}

}  // namespace hr::props
