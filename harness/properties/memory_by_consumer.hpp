// MEM-1 and MEM-2: memory by consumer. MEM-1 compares the analytical prediction
// (harness/step/memory_model.hpp) with what the tracker measures over one step, three
// ways: each consumer's peak, the total peak (workspace included), and, without the
// consumer labels, the live bytes at the forward/backward boundary less those alive
// before the step. MEM-2 is the field guide's practical test ("drop batch size to 1
// and sequence length to something small: if it now runs, your problem is
// activations; if it still fails, it is weights, gradients and optimizer state"),
// checked where its verdict must flip: at the step's total peak and at the small
// rerun's, found by bisection over the budget to a resolution well below the bound.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "harness/registry.hpp"
#include "harness/step/memory_model.hpp"
#include "harness/step/step_config.hpp"

namespace hr {

// What the tracker saw over one step (peaks and live bytes relative to `base`, the
// device before the batch and the step existed).
struct MemoryObservation {
  MemorySnapshot base;      // before the batch and the step were built
  MemorySnapshot before;    // the batch and the step built, step() not yet called
  MemorySnapshot boundary;  // at the first micro-batch's forward/backward boundary
  MemorySnapshot after;     // after step(): the peaks
};
MemoryObservation observe_step(Device& dev, const StepConfig& cfg, uint64_t seed);

// MEM-1's three comparisons of an observation with a prediction (each error relative
// to the measured bytes), with the numbers behind each.
struct MemoryComparison {
  double consumers = 0;  // max over the five consumers of |measured - predicted| peak
  double total = 0;      // |measured - predicted| total peak
  double boundary = 0;   // label-independent: max of |U - predicted| and |U - labelled|, where U =
                         // live bytes at the boundary - live bytes before the step
  nlohmann::json consumers_details, total_details, boundary_details;
};
MemoryComparison compare_memory(const MemoryObservation& o, const MemoryPrediction& p);

// The three MEM-1 checks of one configuration (the tracker against
// predict_memory(cfg, backend)), with Korthikanti et al.'s per-layer formula beside
// ours in the boundary check's details.
std::vector<Measurement> check_memory_model(Device& dev, const StepConfig& cfg, uint64_t seed = 1);

// The negative controls: kept tensors charged to workspace (the model lies about its
// labels; StepConfig::kept_label_fault), a prediction that forgets the LayerNorm
// statistics, and one that ignores checkpointing.
std::vector<Measurement> memory_model_controls(Device& dev, Preset preset, uint64_t seed);

// The grid MEM-1 runs over (depth, width, micro-batch, sequence length, dtype,
// checkpointing, attention implementation, dropout, norms; both models).
std::vector<StepConfig> memory_model_grid(Preset preset);
std::vector<Measurement> mem1_memory_model(RunContext& ctx);

enum class MemoryVerdict { fits, activations, static_state };  // static_state: weights/gradients/optimizer
const char* memory_verdict_name(MemoryVerdict v);  // "fits" | "activations" | "weights_gradients_optimizer_state"

// A triage that is wrong on purpose (MEM-2's negative controls).
enum class TriageFault : uint8_t {
  none,
  batch_outside_budget,  // subtle: the batch is loaded before the budget is measured, so it escapes it
  keeps_seq_len,         // subtle: the rerun shrinks the batch but keeps the sequence length
  no_shrink,             // gross: the rerun keeps the configuration's batch and sequence length
};

struct MemoryDiagnosis {
  MemoryVerdict verdict = MemoryVerdict::fits;
  std::string oom_message;        // the out-of-memory of the configuration as given
  std::string small_oom_message;  // ... of the rerun at micro-batch 1 and a short sequence
  StepConfig small;               // the rerun's configuration
};

// Runs one step of cfg under a budget of `budget_bytes` on top of what the device
// already holds; on out-of-memory reruns at batch = micro-batch = 1 (2 with
// BatchNorm) and seq_len = min(seq_len, short_seq_len) and classifies. The device's
// budget is restored afterwards.
MemoryDiagnosis diagnose_memory(Device& dev, const StepConfig& cfg, size_t budget_bytes, int64_t short_seq_len = 8,
                                TriageFault fault = TriageFault::none, uint64_t seed = 1);

// Where the verdict flips from `below` to `above` as the budget grows, searched in
// (lo, hi] (the verdict at every budget up to the flip being `below`, from it on
// `above`). `guess` (the predicted flip) and the byte below it come first: a flip that
// is where predicted is settled in those two runs, to the byte. Otherwise the far end
// of the bracket on the flip's side is tried (no flip in the bracket: found is false),
// then the bracket is halved until it is at most `resolution_bytes` wide. Each budget
// in `decisive_bytes` that lies inside the bracket is tried before any halving (the
// one nearest the middle first), and the search never stops with one inside: whether
// the flip lies at or below such a budget is always known exactly, as a search to the
// byte would know it.
struct VerdictFlip {
  bool found = false;  // one flip from `below` to `above`, bracketed in (lo_bytes, hi_bytes]
  bool exact = false;  // found, and hi_bytes == lo_bytes + 1: the flip is hi_bytes, to the byte
  size_t lo_bytes = 0, hi_bytes = 0;  // when found: the verdict was `below` at lo_bytes, `above` at hi_bytes
  MemoryVerdict at_lo = MemoryVerdict::fits, at_hi = MemoryVerdict::fits;  // the last bracket's two ends
  int runs = 0;  // triage runs it took
};
VerdictFlip find_verdict_flip(Device& dev, const StepConfig& cfg, MemoryVerdict below, MemoryVerdict above,
                              size_t lo, size_t hi, size_t guess, size_t resolution_bytes = 1,
                              const std::vector<size_t>& decisive_bytes = {}, TriageFault fault = TriageFault::none,
                              uint64_t seed = 1);

// |flip - predicted| / predicted over the budgets a found flip may be at (lo_bytes + 1
// .. hi_bytes): the smallest (0 when predicted is among them) and the largest. For
// an exact flip the two are equal.
struct FlipErrorRange {
  double min = 0, max = 0;
};
FlipErrorRange flip_rel_error_range(const VerdictFlip& f, double predicted_bytes);

std::vector<Measurement> mem2_practical_test(RunContext& ctx);

}  // namespace hr
