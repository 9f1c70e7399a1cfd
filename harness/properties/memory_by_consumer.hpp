// MEM-1 and MEM-2: memory by consumer. MEM-1 compares the analytical prediction
// (harness/step/memory_model.hpp) with the tracker's measured peaks over a grid
// of configurations; MEM-2 is the field guide's practical test ("drop batch size
// to 1 and sequence length to something small: if it now runs, your problem is
// activations; if it still fails, it is weights, gradients and optimizer state").
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "harness/registry.hpp"
#include "harness/step/memory_model.hpp"
#include "harness/step/step_config.hpp"

namespace hr {

// MEM-1's bound: PROPERTIES.md, 5% relative error per consumer.
inline constexpr double kMemoryModelRelError = 0.05;

// One configuration: builds the step, runs one full step on a synthetic batch and
// compares each of the four consumers' peaks with predict_memory(cfg). The
// error is the largest relative error of the four.
Measurement check_memory_model(Device& dev, const StepConfig& cfg);

// The grid MEM-1 runs over (depth, width, micro-batch, sequence length, dtype,
// checkpointing, attention implementation; both models).
std::vector<StepConfig> memory_model_grid(Preset preset);
std::vector<Measurement> mem1_memory_model(RunContext& ctx);

enum class MemoryVerdict { fits, activations, static_state };  // static_state: weights/gradients/optimizer
const char* memory_verdict_name(MemoryVerdict v);  // "fits" | "activations" | "weights_gradients_optimizer_state"

struct MemoryDiagnosis {
  MemoryVerdict verdict = MemoryVerdict::fits;
  std::string oom_message;        // the out-of-memory of the configuration as given
  std::string small_oom_message;  // ... of the rerun at micro-batch 1 and a short sequence
  StepConfig small;               // the rerun's configuration
};

// Runs one step of cfg under a budget of `budget_bytes` on top of what the device
// already holds; on out-of-memory reruns at batch = micro-batch = 1 and
// seq_len = min(seq_len, short_seq_len) and classifies. The device's budget is
// restored afterwards.
MemoryDiagnosis diagnose_memory(Device& dev, const StepConfig& cfg, size_t budget_bytes, int64_t short_seq_len = 8);
std::vector<Measurement> mem2_practical_test(RunContext& ctx);

}  // namespace hr
