// The sharded data-parallel step (harness/dist/sharded_step.hpp) against the
// single-process step: DP-5 (ZeRO-2), DP-6 (ZeRO-3) and ZeRO-1 as a step setting
// (DP-3), each for kShardedSteps steps of SGD with momentum on both models in fp32 and bf16, the
// transformer on padded rows, K = 2 micro-batches per rank, with a delay before
// every all-gather and reduce-scatter; and the sharded rows of DP-MEM (bytes per
// rank per consumer, from the tracker, against predict_sharded) and DP-COMM
// (elements per step against predict_sharded, and ZeRO's analytical volumes).
//
// The reference is another code path: one process, the whole batch as one
// micro-batch, TrainStep's own normalisation and its own optimizer over whole tensors;
// no slicing, no collective, no shard. What is compared is each tensor's update
// since the start, p_s - p_0, after every step: an error in one step's gradient or
// update stays in every later difference.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <tuple>

#include "harness/check.hpp"
#include "harness/data/synthetic.hpp"
#include "harness/dist/sharded_step.hpp"
#include "harness/properties/accum_support.hpp"
#include "harness/properties/dp_support.hpp"
#include "harness/properties/sweep_support.hpp"
#include "harness/step/memory_model.hpp"
#include "harness/tolerances.hpp"

namespace hr::props {
namespace {

using dist::Communicator;
using dist::ShardedStep;
using dist::ShardFault;

struct ShardCase {
  ModelKind model;
  DType dtype;
  bool padded;  // GA-4's long-tailed row lengths (transformer)
};

const ShardCase kShardCases[] = {{ModelKind::mlp, DType::f32, false},
                                 {ModelKind::transformer, DType::f32, true},
                                 {ModelKind::mlp, DType::bf16, false},
                                 {ModelKind::transformer, DType::bf16, true}};

const char* level_id(Sharding s) { return s == Sharding::zero1 ? "DP-3" : s == Sharding::zero2 ? "DP-5" : "DP-6"; }

std::string level_title(Sharding s) {
  switch (s) {
    case Sharding::zero1:
      return "ZeRO-1 as a step setting (optimizer state sharded) equals the single-process step over every step";
    case Sharding::zero2:
      return "ZeRO-2 (gradients reduce-scattered per block, each rank keeping its shard) equals the single-process "
             "step over every step";
    default:
      return "ZeRO-3 (parameters sharded, gathered per block for forward and backward) equals the single-process step "
             "over every step";
  }
}

// SGD with momentum and weight decay: its state (the momentum) is sharded as AdamW's
// moments are, and its update is linear in the gradient, so the update's error is
// the gradient's (DP-1's bound). AdamW's update is sign-like at first: an element
// whose gradient is rounding noise moves by +-lr either way, which no relative bound
// near DP-1's survives (measured: one bias element of 32 flipped, 0.35); AdamW is
// compared bitwise, ZeRO-3 against ZeRO-2 (zero3_against_zero2).
enum class Optim { sgd_momentum, adamw };

StepConfig shard_config(const ShardCase& c, Optim optim, Sharding level, int64_t micro_batch, Preset preset) {
  StepConfig cfg = c.model == ModelKind::mlp ? accum_mlp_config(c.dtype, micro_batch, preset)
                                              : accum_transformer_config(c.dtype, micro_batch, preset);
  // One width short: the MLP's first unit (quick: 63 x 32 + 63 = 2,079 elements) then
  // divides by neither 2 nor 4 ranks, so every shard's padding runs.
  if (c.model == ModelKind::mlp) --cfg.mlp.width;
  cfg.optimizer = OptimizerConfig{};  // AdamW at its defaults (weight decay on weights, off on biases and norms)
  if (optim == Optim::sgd_momentum) {
    cfg.optimizer.kind = OptimizerKind::sgd;
    cfg.optimizer.sgd.lr = 0.01f;
    cfg.optimizer.sgd.momentum = 0.9f;
    cfg.optimizer.sgd.weight_decay = 0.01f;
  }
  cfg.sharding = level;
  return cfg;
}

// The batch of step s (each step its own rows; the transformer's padded).
Batch step_batch(Device& dev, const StepConfig& cfg, const ShardCase& c, uint64_t seed, int64_t s) {
  const uint64_t data_seed = seed * 1000003u + static_cast<uint64_t>(s);
  std::vector<int64_t> lengths;
  if (c.padded) {
    LengthDistribution d;
    d.max = cfg.seq_len;
    d.p95 = cfg.seq_len * 3 / 4;
    d.min = 2;
    lengths = sample_lengths(d, kEffectiveBatch, data_seed + 1);
  }
  StepConfig whole = cfg;
  whole.batch = kEffectiveBatch;
  return accum_batch(dev, whole, data_seed, lengths);
}

NamedValues minus(const NamedValues& a, const NamedValues& b) {
  NamedValues d = a;
  for (size_t t = 0; t < d.size(); ++t)
    for (size_t i = 0; i < d[t].second.size(); ++i) d[t].second[i] -= b[t].second[i];
  return d;
}

// The single-process trajectory: each step's update since the start, and its loss.
struct Trajectory {
  std::vector<NamedValues> updates;
  std::vector<double> losses;
  ZeroGradientRule zero;
};

Trajectory reference(Device& dev, const ShardCase& c, Optim optim, Preset preset, uint64_t seed, int64_t steps) {
  StepConfig cfg = shard_config(c, optim, Sharding::none, kEffectiveBatch, preset);
  Trajectory t;
  t.zero = exact_zero_gradients(cfg);
  TrainStep step(dev, cfg);
  const NamedValues p0 = parameter_values(step);
  for (int64_t s = 0; s < steps; ++s) {
    const StepResult r = step.step(step_batch(dev, cfg, c, seed, s));
    t.losses.push_back(r.loss);
    t.updates.push_back(minus(parameter_values(step), p0));
  }
  return t;
}

struct ShardedRun {
  double error = 0;            // max over steps of the worst tensor's relative L2 (this rank)
  int64_t worst_step = 0;
  std::string worst_tensor;
  double loss_rel_diff = 0;    // max over steps, |loss - reference| / |reference|
  dist::ShardedStepResult last;
  MemorySnapshot held;         // this rank: what the step holds after its steps, peaks over the last one
  int64_t padded = 0, parameters = 0;
};

ShardedRun run_sharded(Device& dev, Communicator& comm, const ShardCase& c, Optim optim, Sharding level,
                       Preset preset, uint64_t seed, int64_t steps, const Trajectory* ref, ShardFault fault) {
  const int64_t mb = kEffectiveBatch / comm.size() / 2;  // K = 2 per rank
  const StepConfig cfg = shard_config(c, optim, level, mb, preset);
  ShardedRun run;
  const MemorySnapshot before = dev.memory().snapshot();
  ShardedStep step(dev, comm, cfg, fault, tol::kShardedCollectiveDelayS);
  run.padded = step.padded_elements();
  run.parameters = step.trainable_elements();
  const NamedValues p0 = step.parameters();
  for (int64_t s = 0; s < steps; ++s) {
    if (s + 1 == steps) dev.memory().reset_peak();
    run.last = step.step(step_batch(dev, cfg, c, seed, s));
    if (ref == nullptr) continue;  // judged on its bytes alone
    const NamedValues update = minus(step.parameters(), p0);
    const TensorsCompare cmp = compare_tensors(update, ref->updates[static_cast<size_t>(s)], ref->zero);
    const double e = std::isnan(cmp.max_rel_l2) ? NAN : cmp.global_rel_l2;  // NaN anywhere: NaN
    if (std::isnan(e) || e > run.error) {
      run.error = e;
      run.worst_step = s + 1;
      run.worst_tensor = cmp.worst;
    }
    const double lref = ref->losses[static_cast<size_t>(s)];
    run.loss_rel_diff = std::max(run.loss_rel_diff, std::fabs(run.last.loss - lref) / std::max(std::fabs(lref), 1e-30));
  }
  run.held = held_since(before, dev.memory().snapshot());
  return run;
}

nlohmann::json shard_config_json(const Communicator& comm, const ShardCase& c, Optim optim, Sharding level,
                                 int64_t steps) {
  return {{"ranks", comm.size()},
          {"engine", comm.engine()},
          {"sharding", sharding_name(level)},
          {"global_batch", kEffectiveBatch},
          {"micro_batches_per_rank", 2},
          {"rows", c.padded ? "padded rows" : "full rows"},
          {"steps", steps},
          {"optimizer", optim == Optim::adamw ? "adamw" : "sgd, momentum 0.9"},
          {"collective_delay_s_per_rank", tol::kShardedCollectiveDelayS}};
}

nlohmann::json run_details(Communicator& comm, Device& dev, const ShardedRun& r) {
  return {{"rank0_worst_step", r.worst_step},
          {"rank0_worst_tensor", r.worst_tensor},
          {"loss_rel_diff_max_over_ranks", max_over_ranks(comm, dev, r.loss_rel_diff)},
          {"trainable_parameters", r.parameters},
          {"padded_elements", r.padded}};
}

// ---- DP-3 (ZeRO-1 as a setting), DP-5, DP-6 ---------------------------------------

void equivalence(Device& dev, Communicator& comm, Preset preset, uint64_t seed, DpOutput& out) {
  const int64_t steps = tol::kShardedSteps;
  for (const ShardCase& c : kShardCases) {
    const Trajectory ref = reference(dev, c, Optim::sgd_momentum, preset, seed, steps);
    for (Sharding level : {Sharding::zero1, Sharding::zero2, Sharding::zero3}) {
      CheckFamily f(out.measurements, dev, c.dtype, model_kind_name(c.model), level_id(level), level_title(level),
                    tol::kShardedUpdateRelL2(c.dtype),
                    "max over steps of global_rel_l2 of the update since the start (max over ranks)",
                    tol::kShardedUpdateReason);
      const ShardedRun r =
          run_sharded(dev, comm, c, Optim::sgd_momentum, level, preset, seed, steps, &ref, ShardFault::none);
      f.check(max_over_ranks(comm, dev, r.error), shard_config_json(comm, c, Optim::sgd_momentum, level, steps),
              run_details(comm, dev, r));

      // The controls, on the fp32 transformer (padded rows), over fewer steps: a fault
      // shows in the first step's update and stays in every later one.
      if (!(c.model == ModelKind::transformer && c.dtype == DType::f32)) continue;
      struct Control {
        ShardFault fault;
        bool subtle;
        const char* title;
      };
      std::vector<Control> controls = {
          {ShardFault::drop_rank_contribution, false, "a reduce-scatter that drops the last rank's gradients is flagged"},
          {ShardFault::shard_one_short, false, "optimizer state one element short of every shard is flagged"},
          {ShardFault::fp16_reduce_scatter, true, "gradients reduce-scattered in fp16 (a compression hook) are flagged"}};
      if (level != Sharding::zero1)
        controls.push_back({ShardFault::last_micro_batch_only, false,
                            "keeping only the last micro-batch's gradient in the shard is flagged"});
      if (level == Sharding::zero3)
        controls.push_back({ShardFault::gather_reuses_previous, false,
                            "a backward gather that reuses the next block's buffer is flagged"});
      for (const Control& k : controls) {
        const int64_t control_steps = tol::kShardedControlSteps;
        const ShardedRun b =
            run_sharded(dev, comm, c, Optim::sgd_momentum, level, preset, seed, control_steps, &ref, k.fault);
        nlohmann::json cfg = shard_config_json(comm, c, Optim::sgd_momentum, level, control_steps);
        cfg["fault"] = dist::shard_fault_name(k.fault);
        nlohmann::json d = run_details(comm, dev, b);
        if (k.subtle) d["fault"] = tol::kShardedSubtleReason;
        const double e = max_over_ranks(comm, dev, b.error);
        if (k.subtle) f.subtle(k.title, e, cfg, d);
        else f.gross(k.title, e, cfg, d);
      }
    }
  }
}

// DP-6's AdamW check: ZeRO-3 against ZeRO-2, bitwise. Both reduce-scatter every
// micro-batch's gradient into the same shards in the same order and run AdamW on
// the same pieces; they differ in where the parameters live (every rank whole, or
// gathered per block from fp32 shards, rounded on the owning rank), which is what
// is compared. A control is judged after its first step: from then on the
// parameters differ, so every later gradient does.
void zero3_against_zero2(Device& dev, Communicator& comm, Preset preset, uint64_t seed, DpOutput& out) {
  const int64_t steps = tol::kShardedAdamSteps;
  const std::string title =
      "ZeRO-3 with AdamW equals ZeRO-2 with AdamW bitwise (the parameters gathered per block, not held whole)";
  for (const ShardCase& c : {kShardCases[1], kShardCases[3]}) {
    auto trajectory = [&](Sharding level, ShardFault fault, int64_t n_steps) {
      const int64_t mb = kEffectiveBatch / comm.size() / 2;
      ShardedStep step(dev, comm, shard_config(c, Optim::adamw, level, mb, preset), fault,
                       tol::kShardedCollectiveDelayS);
      std::vector<NamedValues> after;
      for (int64_t s = 0; s < n_steps; ++s) {
        step.step(step_batch(dev, shard_config(c, Optim::adamw, level, mb, preset), c, seed, s));
        after.push_back(step.parameters());
      }
      return after;
    };
    const std::vector<NamedValues> zero2 = trajectory(Sharding::zero2, ShardFault::none, steps);
    auto mismatches = [&](const std::vector<NamedValues>& got, int64_t upto) {
      double worst = 0;
      for (int64_t s = 0; s < upto; ++s)
        worst = std::max(worst, static_cast<double>(count_bitwise_mismatches(got[static_cast<size_t>(s)],
                                                                            zero2[static_cast<size_t>(s)])));
      return max_over_ranks(comm, dev, worst);
    };
    CheckFamily f(out.measurements, dev, c.dtype, model_kind_name(c.model), "DP-6", title, tol::kBitwiseMismatches,
                  "parameter elements differing bitwise from ZeRO-2's, worst step (max over ranks)",
                  tol::kShardedZero3BitwiseReason);
    f.check(mismatches(trajectory(Sharding::zero3, ShardFault::none, steps), steps),
            shard_config_json(comm, c, Optim::adamw, Sharding::zero3, steps));
    if (c.dtype != DType::f32) continue;
    for (const auto& [fault, subtle, words] :
         {std::tuple{ShardFault::gather_reuses_previous, false,
                     "ZeRO-3 whose backward gather reuses the next block's buffer differs from ZeRO-2"},
          std::tuple{ShardFault::shard_one_short, true,
                     "ZeRO-3 with optimizer state one element short of every shard differs from ZeRO-2"}}) {
      nlohmann::json cfg = shard_config_json(comm, c, Optim::adamw, Sharding::zero3, 1);
      cfg["fault"] = dist::shard_fault_name(fault);
      const double e = mismatches(trajectory(Sharding::zero3, fault, 1), 1);
      if (subtle) f.subtle(words, e, cfg);
      else f.gross(words, e, cfg);
    }
  }
}

// ---- DP-MEM and DP-COMM ----------------------------------------------------------

// The five static numbers a rank's tracker shows against the prediction, in bytes.
struct StaticBytes {
  double weights, weights_peak, gradients, gradients_peak, optimizer_state;
};

StaticBytes measured_static(const MemorySnapshot& m) {
  auto cur = [&](Consumer c) { return static_cast<double>(m.current_bytes[static_cast<int>(c)]); };
  auto peak = [&](Consumer c) { return static_cast<double>(m.peak_bytes[static_cast<int>(c)]); };
  return {cur(Consumer::weights), peak(Consumer::weights), cur(Consumer::gradients), peak(Consumer::gradients),
          cur(Consumer::optimizer_state)};
}

double largest_miss(const StaticBytes& a, const ShardedPrediction& p, nlohmann::json* details) {
  const double pred[] = {static_cast<double>(p.weights), static_cast<double>(p.weights_peak),
                         static_cast<double>(p.gradients), static_cast<double>(p.gradients_peak),
                         static_cast<double>(p.optimizer_state)};
  const double got[] = {a.weights, a.weights_peak, a.gradients, a.gradients_peak, a.optimizer_state};
  const char* names[] = {"weights", "weights_peak", "gradients", "gradients_peak", "optimizer_state"};
  double worst = 0;
  for (int i = 0; i < 5; ++i) {
    worst = std::max(worst, std::fabs(got[i] - pred[i]));
    if (details) (*details)[names[i]] = {{"measured_rank0", got[i]}, {"predicted", pred[i]}};
  }
  return worst;
}

// Elements per step over the busiest link (nccl-tests' bus bytes over the element
// size): what the prediction's payload comes to, (N - 1) / N of it.
double bus_elements(const dist::CommStats& s, size_t element) { return s.bus_bytes / static_cast<double>(element); }

void memory_and_comm(Device& dev, Communicator& comm, Preset preset, uint64_t seed, DpOutput& out) {
  const int64_t steps = 2;  // the second step's peak: every buffer exists by then
  const int n = comm.size();
  for (const ShardCase& c : {kShardCases[1], kShardCases[3]}) {  // the transformer, fp32 and bf16
    for (Sharding level : {Sharding::zero1, Sharding::zero2, Sharding::zero3}) {
      const int64_t mb = kEffectiveBatch / n / 2;
      const ShardedPrediction pred = predict_sharded(shard_config(c, Optim::adamw, level, mb, preset), n);
      const ShardedRun r = run_sharded(dev, comm, c, Optim::adamw, level, preset, seed, steps, nullptr, ShardFault::none);
      nlohmann::json cfg = shard_config_json(comm, c, Optim::adamw, level, steps);
      mem_points(dev, comm, model_kind_name(c.model), c.dtype, {{"sharding", sharding_name(level)}}, r.held, out);

      const size_t s = dtype_size(c.dtype), param_elem = level == Sharding::zero3 ? s : 4;
      SweepPoint p = sweep_point("DP-COMM", dev, c.dtype, model_kind_name(c.model),
                                 {{"ranks", n}, {"engine", comm.engine()}, {"sync", sharding_name(level)},
                                  {"micro_batches_per_rank", r.last.micro_batches}});
      p.metrics = {{"gradient_payload_bytes_per_step", r.last.gradients.payload_bytes},
                   {"gradient_payload_elements_per_step", static_cast<double>(r.last.gradients.payload_bytes) / 4},
                   {"parameter_payload_elements_per_step",
                    static_cast<double>(r.last.parameters.payload_bytes) / static_cast<double>(param_elem)},
                   {"predicted_gradient_elements_per_step", pred.gradient_elements},
                   {"predicted_parameter_elements_per_step", pred.parameter_elements},
                   {"zero_paper_elements_per_step", pred.zero_paper_elements},
                   {"payload_bytes_per_step", r.last.gradients.payload_bytes + r.last.parameters.payload_bytes +
                                                  r.last.other.payload_bytes},
                   {"bus_bytes_per_step", r.last.gradients.bus_bytes + r.last.parameters.bus_bytes + r.last.other.bus_bytes},
                   {"collectives_per_step", r.last.gradients.calls + r.last.parameters.calls + r.last.other.calls},
                   {"trainable_parameters", pred.parameters},
                   {"padded_elements", pred.padded}};
      out.points.push_back(std::move(p));

      // DP-MEM: the tracker's bytes on every rank against the prediction.
      {
        CheckFamily f(out.measurements, dev, c.dtype, model_kind_name(c.model), "DP-MEM",
                      fmt::format("ZeRO-{} bytes per rank per consumer (weights, gradients, optimizer state; held and "
                                  "at the peak) equal the sharded memory model",
                                  static_cast<int>(level)),
                      tol::kBitwiseMismatches, "largest |measured - predicted| bytes over five numbers (max over ranks)",
                      tol::kShardedBytesReason);
        nlohmann::json d;
        const double miss = largest_miss(measured_static(r.held), pred, &d);
        f.check(max_over_ranks(comm, dev, miss), cfg, d);
        // Gross: ZeRO-2/3 keeping every full gradient buffer; ZeRO-1 (whose gradients
        // are whole by design) holding the whole optimizer state on every rank.
        const auto gross = level == Sharding::zero1
                               ? std::tuple{ShardFault::whole_state, false,
                                            "every rank holding the whole optimizer state is flagged"}
                               : std::tuple{ShardFault::keep_full_gradients, false,
                                            "full gradient buffers never freed after their reduce-scatter are flagged"};
        for (const auto& [fault, subtle, title] :
             {gross, std::tuple{ShardFault::shard_one_short, true,
                                "optimizer state one element short of every shard is flagged"}}) {
          const ShardedRun b = run_sharded(dev, comm, c, Optim::adamw, level, preset, seed, steps, nullptr, fault);
          nlohmann::json bc = cfg, bd;
          bc["fault"] = dist::shard_fault_name(fault);
          const double e = max_over_ranks(comm, dev, largest_miss(measured_static(b.held), pred, &bd));
          if (subtle) f.subtle(title, e, bc, bd);
          else f.gross(title, e, bc, bd);
        }
      }
      // DP-COMM: the elements per step over the busiest link against the prediction
      // (ZeRO-1/2: the gradients' reduce-scatter and the masters' all-gather, 2 P in
      // the paper's count; ZeRO-3: two gathers of the blocks and one reduce-scatter, 3 P).
      const double factor = dist::reduce_scatter_bus_factor(n);
      auto comm_miss = [&](const dist::ShardedStepResult& res, nlohmann::json* d) {
        const double g = bus_elements(res.gradients, 4), q = bus_elements(res.parameters, param_elem);
        const double pg = pred.gradient_elements * factor, pq = pred.parameter_elements * factor;
        if (d) {
          (*d)["gradient_bus_elements"] = {{"measured", g}, {"predicted", pg}};
          (*d)["parameter_bus_elements"] = {{"measured", q}, {"predicted", pq}};
          (*d)["zero_paper_elements_per_step"] = pred.zero_paper_elements;
          (*d)["measured_over_zero_paper"] =
              pred.zero_paper_elements > 0 ? (res.gradients.payload_bytes / 4.0 +
                                              static_cast<double>(res.parameters.payload_bytes) / param_elem) /
                                                 pred.zero_paper_elements
                                           : 0.0;
        }
        return std::max(std::fabs(g - pg), std::fabs(q - pq));
      };
      CheckFamily f(out.measurements, dev, c.dtype, model_kind_name(c.model), "DP-COMM",
                    fmt::format("ZeRO-{} elements per step over the busiest link (gradients and parameters) equal "
                                "the sharded model's volumes",
                                static_cast<int>(level)),
                    tol::kBitwiseMismatches, "largest |measured - predicted| bus elements per step (max over ranks)",
                    tol::kShardedCommReason);
      nlohmann::json d;
      const double comm_error = max_over_ranks(comm, dev, comm_miss(r.last, &d));  // d filled before it is passed
      f.check(comm_error, cfg, d);
      for (const auto& [fault, subtle, title] :
           {std::tuple{ShardFault::all_reduce_gradients, false,
                       "gradients all-reduced in full instead of reduce-scattered are flagged"},
            std::tuple{ShardFault::reduce_scatter_one_short, true,
                       "a reduce-scatter one element short per rank is flagged"}}) {
        const ShardedRun b = run_sharded(dev, comm, c, Optim::adamw, level, preset, seed, steps, nullptr, fault);
        nlohmann::json bc = cfg, bd;
        bc["fault"] = dist::shard_fault_name(fault);
        const double e = max_over_ranks(comm, dev, comm_miss(b.last, &bd));
        if (subtle) f.subtle(title, e, bc, bd);
        else f.gross(title, e, bc, bd);
      }
    }
  }
}

}  // namespace

void dp_sharding(Device& dev, Communicator& comm, Preset preset, uint64_t seed, DpOutput& out) {
  equivalence(dev, comm, preset, seed, out);
  zero3_against_zero2(dev, comm, preset, seed, out);
  memory_and_comm(dev, comm, preset, seed, out);
}

}  // namespace hr::props
