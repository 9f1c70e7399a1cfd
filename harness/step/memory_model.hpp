// The analytical memory model of a training step (MEM-1): bytes per consumer
// predicted from the configuration alone, to compare with what the tracking
// allocator measures.
//   weights          = P * 4 (fp32 masters) + P * s (16-bit compute copies)
//                      [+ BatchNorm running statistics 2 * W * 4 per norm layer]
//   gradients        = P_trainable * 4 (fp32 accumulation)
//   optimizer state  = AdamW 8 * P_trainable, SGD with momentum 4 * P_trainable, else 0
//   activations      = the per-layer formulas written out in memory_model.cpp,
//                      in the spirit of Korthikanti et al. 2022's
//                      s*b*h*(34 + 5*a*s/h): peak over the micro-batch's forward
//                      and (with checkpointing) the recompute of each segment.
// Workspace (temporaries, the batch) is not predicted.
#pragma once

#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>

#include "harness/step/step_config.hpp"

namespace hr {

struct MemoryPrediction {
  size_t weights = 0, gradients = 0, optimizer_state = 0, activations = 0;
  int64_t parameters = 0;
  nlohmann::json breakdown = nlohmann::json::object();  // the terms behind the activations
  size_t of(Consumer c) const;
  size_t static_bytes() const { return weights + gradients + optimizer_state; }
};

MemoryPrediction predict_memory(const StepConfig& cfg);

// Parameter count of a configuration's model (no allocation).
int64_t parameter_count(const StepConfig& cfg);

}  // namespace hr
