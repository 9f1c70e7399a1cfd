// Test helpers for the training step: small configurations of both models,
// gradient snapshots, and comparisons between two runs' gradients.
#pragma once

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "harness/compare.hpp"
#include "harness/step/train_step.hpp"

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

}  // namespace hr::test
