// `headroom dump`: a controlled model's training steps written as files a
// framework developer can load and check their own implementation against:
//   hr::DumpResult hr::dump_model(hr::Device& dev, const hr::StepConfig& cfg,
//                                 const std::string& out_dir, const hr::DumpOptions& opt);
// Files in out_dir (created if missing):
// - always: weights.safetensors (the initial parameters, fp32 masters, [out, in]
//   layout, and the model's buffers) and conventions.json (the configuration and
//   every rule needed to reproduce the numbers: layout, GELU form, norms, attention
//   scale and masks, the batch layout, dropout RNG, loss reduction and divisors,
//   init, optimizer, loss scaler, and what each step did);
// - without steps (opt.steps = 0): batch.safetensors, loss.safetensors ("loss",
//   F64), gradients.safetensors (every trainable parameter's fp32 gradient of that
//   loss, unscaled, accumulated over the micro-batches exactly as the step does) and
//   dropout_masks.safetensors (the keep masks drawn, uint8, when a site has p > 0)
//   of one forward + backward with no optimizer step;
// - with opt.steps = N: step_<s>/ for s = 1..N, each holding that step's batch,
//   loss, gradients (what the optimizer was given, or the non-finite ones of a
//   skipped step) and masks, then weights.safetensors (the masters and, in 16-bit,
//   the compute copies after the step) and optimizer_state.safetensors (the state as
//   stored after it: fp32 moments, or 8-bit codes, absmax per block and both maps).
// Data-parallel ranks are written by the headroom-dp worker (dump_rank below).
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "harness/data/batch.hpp"
#include "harness/device.hpp"
#include "harness/dump/safetensors.hpp"
#include "harness/step/step_config.hpp"

namespace hr {

// How the rows of a dumped language-model batch hold their sequences.
enum class DumpLayout : uint8_t {
  padded,  // one sequence per row, padded to seq_len (key_valid_len marks the padding)
  packed,  // first-fit decreasing, several per row: segment ids, positions restarting
};
const char* dump_layout_name(DumpLayout l);  // "padded" | "packed"
DumpLayout parse_dump_layout(const std::string& s);

inline constexpr int64_t kMaxDumpSteps = 1000;
inline constexpr int64_t kMaxDumpRanks = 64;

struct DumpOptions {
  uint64_t data_seed = 1;  // step s draws its batch from data_seed + s - 1
  int64_t steps = 0;       // 0: one forward + backward, no optimizer step; N: N optimizer steps
  // 1-based steps whose micro-batches' losses are multiplied by 2^64 before their
  // backward passes: the fp16 gradients overflow and the loss scaler must skip the
  // step and back off. fp16 with loss scaling only.
  std::vector<int64_t> overflow_steps;
  DumpLayout layout = DumpLayout::padded;  // transformer only
  // The sequences' lengths (transformer): padded, one per row (batch of them);
  // packed, first-fit decreasing into the batch's rows. Empty: drawn from the
  // length distribution (padded: one per row; packed: sequences drawn in order
  // while they still pack into the rows).
  std::vector<int64_t> lengths;
  // > 0: data parallel over this many ranks (headroom-dp under mpirun writes
  // rank_<r>/); dump_model writes the single-process reference beside them and the
  // ranks' part of conventions.json.
  int64_t ranks = 0;
};

// Refuses options that do not fit the configuration (InvalidArgument naming the
// option, e.g. "--overflow-steps: 5 is past --steps 3").
void validate(const DumpOptions& opt, const StepConfig& cfg);

struct DumpResult {
  std::vector<std::string> files;  // paths written
  double loss = 0;                 // the first step's (or the one pass's) loss
  int64_t steps = 0, steps_skipped = 0;
  int64_t tensors = 0;             // tensors written over all files
  int64_t gradient_values = 0;     // over every gradient tensor of every step
  // Of which inf or NaN, outside the steps whose overflow was asked for.
  int64_t nonfinite_gradients = 0;
  bool loss_scaled = false;        // fp16 with the loss scaler on: non-finite gradients skip the step
};

// Validates cfg and opt (InvalidArgument naming the field), builds the model from
// cfg.init_seed, draws the batches, runs the pass or the steps and writes the files.
DumpResult dump_model(Device& dev, const StepConfig& cfg, const std::string& out_dir, const DumpOptions& opt);
inline DumpResult dump_model(Device& dev, const StepConfig& cfg, const std::string& out_dir, uint64_t data_seed = 1) {
  DumpOptions opt;
  opt.data_seed = data_seed;
  return dump_model(dev, cfg, out_dir, opt);
}

// One dumped batch: the tensors the step reads, the entries batch.safetensors
// holds (with each sequence's row, offset and length for the transformer) and what
// conventions.json says of it.
struct DumpBatch {
  Batch batch;
  std::vector<SafetensorsEntry> entries;
};
DumpBatch make_dump_batch(Device& dev, const StepConfig& cfg, const DumpOptions& opt, uint64_t seed);

// A batch's tensors as batch.safetensors holds them (a rank's: its slice of the batch).
std::vector<SafetensorsEntry> batch_entries(const Batch& batch);

// A flat vector of the trainable parameters' values (their order, each row-major)
// as one entry per parameter, named and shaped as the parameters.
class TrainStep;
std::vector<SafetensorsEntry> flat_entries(TrainStep& step, const std::vector<float>& flat);

// The parameters as weights.safetensors holds them: fp32 masters under their names,
// with_compute the 16-bit compute copies too (as <name>.compute, where they are a
// copy), then the model's buffers.
std::vector<SafetensorsEntry> weight_entries(TrainStep& step, bool with_compute);

// The files' metadata every dump writes.
void write_dump_file(const std::string& path, const std::vector<SafetensorsEntry>& entries);

}  // namespace hr
