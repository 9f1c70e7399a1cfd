// TRADE and BM-FIT (docs/catalogue.md BM): the field guide's order of techniques applied
// cumulatively to one transformer, each row measured on this device (bytes per
// consumer, step time, useful tokens/s, the loss after a few steps against the
// baseline's), and the largest micro-batch each row fits into a memory budget.
// The same rows feed `headroom plan` (harness/plan/), which predicts them on other cards.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "harness/registry.hpp"
#include "harness/step/step_config.hpp"
#include "harness/timing.hpp"

namespace hr::props {

// How a row lays its documents into rows of tokens.
enum class TradeLayout : uint8_t { pad_to_max, packed };

// One row of the trade table: the configuration with every technique up to it.
struct TradeRow {
  std::string technique;  // "baseline", "+ mixed precision (bf16)", ...
  std::string key;        // short stable key: baseline, mixed_precision, seq_padding, accumulation, ...
  StepConfig cfg;         // batch = the row's rows per step; micro_batch as the row runs it
  TradeLayout layout = TradeLayout::pad_to_max;
  // The reference its loss is judged against: the baseline, or for LoRA the baseline
  // with the same adapters (LoRA trains other parameters by design).
  std::string reference_key = "baseline";
};

struct TradeSetup {
  std::vector<TradeRow> rows;       // in the field guide's order, baseline first
  std::vector<int64_t> doc_lengths; // the documents every row trains on (tokens)
  int64_t padded_rows = 0;          // one document per row, padded to seq_len
  int64_t packed_rows = 0;          // first-fit decreasing into rows of seq_len
  int loss_steps = 4;               // optimizer steps before the loss is read
  int64_t preset_docs = 0;          // the preset's document count, before it was fitted
  double baseline_predicted_peak = 0;  // the baseline row's peak by the memory model (bytes)
};

// quick: the quick transformer (fp32 baseline on the CPU); full: the full one (the
// baseline in fp32 on a GPU too: mixed precision is the first technique). The
// preset's documents (quick 32, full 64) are halved while the baseline row's
// predicted peak is over 80% of memory_bytes (the device's; 0: no limit), so that a
// smaller card measures every row rather than none.
TradeSetup trade_setup(Preset preset, BackendKind backend, size_t memory_bytes);
// How a TRADE row's step is timed (at least kMinJudgedReps samples, so validate can
// judge it slower).
TimingOptions trade_timing();

// A fault that breaks training while saving the same memory (TRADE's controls).
enum class TradeFault : uint8_t {
  none,
  lora_scale_alpha,      // gross: LoRA's adapter scaled by alpha instead of alpha / r (r = 8: 8x)
  one_step_skipped,      // subtle: one optimizer step of the few lost, as an overflow check that
                         // fires without an overflow skips it
};

struct TradeLoss {
  double loss_start = 0, loss_end = 0;  // before the first step, after loss_steps steps
  bool ok = false;
  std::string reason;
};

// The row's configuration trained for setup.loss_steps steps on the setup's documents.
TradeLoss trade_loss(Device& dev, const TradeSetup& setup, const TradeRow& row, uint64_t seed,
                     TradeFault fault = TradeFault::none);

// BM-FIT: the largest micro-batch (rows of seq_len tokens, one micro-batch per step)
// that fits `budget_bytes` on top of what the device holds, found by galloping then
// bisection over real steps (an OutOfMemory, from the tracker's budget or from the
// device, is "does not fit"). max_micro_batch bounds the search (found == max: at least).
struct FitResult {
  int64_t micro_batch = 0;        // 0: not even one row fits
  int64_t max_micro_batch = 0;
  int probes = 0;                 // steps it ran
  size_t peak_bytes_at_fit = 0;   // measured total peak at the found micro-batch
  size_t budget_bytes = 0;
  std::vector<std::pair<int64_t, bool>> trail;  // (micro-batch, fits) in probe order
};
// Searches that are wrong on purpose (BM-FIT's controls).
enum class FitFault : uint8_t {
  none,
  first_not_fitting,  // subtle: the bisection reports the first micro-batch that did not fit
  no_bisection,       // gross: galloping alone, reporting the first power of two that did not fit
};
FitResult find_largest_micro_batch(Device& dev, const StepConfig& cfg, std::optional<size_t> budget_bytes,
                                   int64_t max_micro_batch, uint64_t seed, FitFault fault = FitFault::none);
// The configuration a fit probe runs: cfg at micro-batch = batch = m (full rows).
StepConfig fit_probe_config(const StepConfig& cfg, int64_t micro_batch);
// The memory model's answer (MEM-1's prediction): the largest m <= max whose predicted
// total peak is within the budget.
int64_t predicted_largest_micro_batch(const StepConfig& cfg, size_t budget_bytes, int64_t max_micro_batch,
                                      BackendKind backend);
// The budget of the quick run: the baseline's predicted total peak at this micro-batch,
// so the baseline fits exactly it and every later row shows what it buys.
inline constexpr int64_t kFitBudgetBaselineMicroBatch = 2;
inline constexpr int64_t kFitMaxMicroBatch = 256;

}  // namespace hr::props
