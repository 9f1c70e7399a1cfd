// Synthetic data for the controlled models, all drawn from the shared Philox
// stream so a batch is the same on every backend and every run:
// - a controlled length distribution (a log-normal long tail truncated at a
//   maximum: by default p95 = 900 and max = 4096 tokens, the field guide's
//   example; scaled() shrinks it for small sequence lengths);
// - a learnable language-modelling task (each sequence follows one fixed random
//   successor map, token t -> succ[t]: a bigram a model learns in a few steps),
//   padded (key_valid_len) or packed (segment ids, positions restarting);
// - a learnable regression / classification task for the MLP (a fixed random
//   "teacher" layer tanh(A x) / argmax A x);
// - the controlled-gradient-magnitude knob: the loss multiplier that puts the
//   median gradient magnitude at a chosen value (e.g. under fp16's 2^-24).
// Data tensors are Consumer::workspace (the data pipeline's, not the step's).
#pragma once

#include <cstdint>
#include <vector>

#include "harness/data/batch.hpp"
#include "harness/models/presets.hpp"

namespace hr {

class TrainStep;
struct PackPlan;

struct LengthDistribution {
  int64_t p95 = 900;
  int64_t max = 4096;
  int64_t min = 1;
  double sigma = 0.8;  // log-space spread; the median is p95 / exp(1.645 sigma)
  // The same shape with max = max_len (p95 and min scaled by max_len / max).
  LengthDistribution scaled(int64_t max_len) const;
};

std::vector<int64_t> sample_lengths(const LengthDistribution& d, int64_t n, uint64_t seed);

// What the language-modelling rows look like.
struct LmTask {
  uint64_t task_seed = 7;  // fixes the successor map (the "language")
  int32_t pad_id = 0;
};

// Rows of seq_len tokens. lengths (optional, one per row, each in [1, seq_len]):
// tokens past a row's length are padding (pad_id, target ignore_index) and the
// row's key_valid_len is its length. Targets are the next token; a row's last
// real token has target ignore_index.
Batch make_lm_batch(Device& dev, const TransformerConfig& cfg, int64_t rows, int64_t seq_len, uint64_t seed,
                    const std::vector<int64_t>& lengths = {}, const LmTask& task = {});

// The task's token sequences, one per length: sequence i starts at a random token
// (Philox, seed, i) and follows the successor map.
std::vector<std::vector<int32_t>> make_lm_sequences(const TransformerConfig& cfg, const std::vector<int64_t>& lengths,
                                                    uint64_t seed, const LmTask& task = {});

// Packs sequences of the given lengths into rows of seq_len tokens (first-fit
// decreasing; each length <= seq_len): positions restart at 0 and segment ids
// count up within a row; a sequence's last token and the row's tail have target
// ignore_index; the unused tail is padding in its own segment. Throws when the
// sequences need more than `rows` rows. (harness/data/packing.hpp: the steps.)
// placed (optional): where each sequence went.
Batch make_packed_lm_batch(Device& dev, const TransformerConfig& cfg, int64_t rows, int64_t seq_len,
                           const std::vector<int64_t>& lengths, uint64_t seed, const LmTask& task = {},
                           PackPlan* placed = nullptr);

struct MlpTaskSpec {
  uint64_t task_seed = 11;  // fixes the teacher
  float target_scale = 1.f; // regression targets are target_scale * tanh(A x)
};
Batch make_mlp_batch(Device& dev, const MlpConfig& cfg, int64_t rows, uint64_t seed, const MlpTaskSpec& task = {});

// The loss multiplier that makes the median |gradient| over every non-zero
// gradient element equal `target`, measured with a forward + backward of
// `step` on `batch` (best in fp32). Returns step.config().loss_multiplier
// * target / median.
double loss_multiplier_for_grad_magnitude(TrainStep& step, const Batch& batch, double target);

}  // namespace hr
