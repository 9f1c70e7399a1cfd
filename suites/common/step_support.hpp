// Test helpers for the training step: small configurations of both models,
// gradient snapshots, and comparisons between two runs' gradients.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "harness/compare.hpp"
#include "harness/step/train_step.hpp"
#include "harness/tolerances.hpp"
#include "suites/common/ref_transformer.hpp"

namespace hr::test {

// A transformer small enough for finite differences and quick CPU steps.
inline StepConfig tiny_transformer_config(DType dtype = DType::f32) {
  StepConfig c;
  c.model = ModelKind::transformer;
  c.transformer.vocab = 48;
  c.transformer.max_positions = 16;
  c.transformer.d_model = 32;
  c.transformer.heads = 4;
  c.transformer.layers = 2;
  c.seq_len = 12;
  c.batch = 4;
  c.micro_batch = 2;
  c.precision.compute = dtype;
  return c;
}

inline StepConfig tiny_mlp_config(DType dtype = DType::f32, NormKind norm = NormKind::none) {
  StepConfig c;
  c.model = ModelKind::mlp;
  c.mlp.in_dim = 16;
  c.mlp.width = 48;
  c.mlp.out_dim = 8;
  c.mlp.layers = 4;
  c.mlp.norm = norm;
  c.batch = 32;
  c.micro_batch = 16;
  c.precision.compute = dtype;
  return c;
}

// name -> raw gradient bytes / fp32 values.
inline std::map<std::string, std::vector<uint8_t>> grad_bytes(const TrainStep& s) {
  std::map<std::string, std::vector<uint8_t>> out;
  for (const auto& [n, g] : s.gradients()) out[n] = g.to_host_bytes();
  return out;
}
inline std::map<std::string, std::vector<float>> grad_values(const TrainStep& s) {
  std::map<std::string, std::vector<float>> out;
  for (const auto& [n, g] : s.gradients()) out[n] = g.to_host_f32();
  return out;
}

// All gradients concatenated, in parameter order.
inline std::vector<float> flat(const std::map<std::string, std::vector<float>>& m) {
  std::vector<float> out;
  for (const auto& [n, v] : m) out.insert(out.end(), v.begin(), v.end());
  return out;
}

inline bool all_finite(const std::vector<float>& v) {
  for (float x : v)
    if (!std::isfinite(x)) return false;
  return true;
}

inline double squared_norm(const std::vector<float>& v) {
  double s = 0;
  for (float x : v) s += static_cast<double>(x) * x;
  return s;
}

// One forward + backward under a checkpoint policy: gradient bytes, all
// gradients flattened, and the forward executions per segment.
struct CheckpointRun {
  std::map<std::string, std::vector<uint8_t>> bytes;
  std::vector<float> values;
  std::vector<int64_t> segment_counts;
};
inline CheckpointRun run_with_checkpointing(Device& dev, StepConfig cfg, const Batch& batch, int64_t every_k,
                                            bool fresh_rng) {
  cfg.checkpoint.every_k_blocks = every_k;
  cfg.checkpoint.fresh_rng_on_recompute = fresh_rng;
  TrainStep s(dev, cfg);
  s.forward_backward(batch);
  return {grad_bytes(s), flat(grad_values(s)), s.segment_forward_counts()};
}

// CK-1's mechanism on `cfg` (dropout > 0, `blocks` blocks): for each k, every
// gradient byte equals the run without checkpointing and each segment ran its
// forward twice per micro-batch; CK-2's control (fresh RNG on recompute)
// changes the gradients by more than the catalogue's 1e-3.
inline void expect_checkpointing_replays_dropout(Device& dev, const StepConfig& cfg, const Batch& batch,
                                                 int64_t blocks, const std::vector<int64_t>& ks) {
  const CheckpointRun base = run_with_checkpointing(dev, cfg, batch, 0, false);
  for (int64_t k : ks) {
    SCOPED_TRACE("every_k_blocks = " + std::to_string(k));
    const CheckpointRun ck = run_with_checkpointing(dev, cfg, batch, k, false);
    for (const auto& [name, bytes] : base.bytes) EXPECT_EQ(bitwise_mismatches(bytes, ck.bytes.at(name)), 0u) << name;
    ASSERT_EQ(static_cast<int64_t>(ck.segment_counts.size()), (blocks + k - 1) / k);
    for (int64_t c : ck.segment_counts) EXPECT_EQ(c, 2 * cfg.accum_steps());  // forward + recompute
    const CheckpointRun broken = run_with_checkpointing(dev, cfg, batch, k, true);
    EXPECT_GT(rel_l2(broken.values, base.values), tol::kCheckpointFreshRngMinRelL2);
  }
}

// The parameters' fp32 master weights in float64, by name: what the float64
// reference models (ref_transformer.hpp, ref_mlp.hpp) read.
inline std::map<std::string, std::vector<double>> master_weights_f64(const ParamSet& params) {
  std::map<std::string, std::vector<double>> out;
  for (const Param& p : params.all()) {
    const auto v = p.master.to_host_f32();
    out[p.name] = std::vector<double>(v.begin(), v.end());
  }
  return out;
}

// A language-model batch of `rows` x `seq_len` tokens as the float64 transformer reads it.
inline RefLmBatch ref_lm_batch(const Batch& batch, int64_t rows, int64_t seq_len) {
  RefLmBatch rb;
  rb.B = rows;
  rb.T = seq_len;
  rb.ids = batch.ids.to_host_i32();
  rb.pos = batch.pos.to_host_i32();
  rb.targets = batch.targets.to_host_i32();
  rb.key_valid_len = batch.key_valid_len.to_host_i32();
  return rb;
}

}  // namespace hr::test
