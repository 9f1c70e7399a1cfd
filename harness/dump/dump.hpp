// `headroom dump`: writes one training step's worth of a controlled model as
// files a framework developer can load and check their own implementation
// against:
//   hr::DumpResult hr::dump_model(hr::Device& dev, const hr::StepConfig& cfg,
//                                 const std::string& out_dir, uint64_t data_seed = 1);
// Files in out_dir (created if missing): weights.safetensors (initial fp32
// parameters, [out, in] layout), batch.safetensors (the input batch),
// loss.safetensors ("loss", F64 scalar), gradients.safetensors (every
// parameter's fp32 gradient of that loss, unscaled, accumulated over the
// micro-batches exactly as the step does), dropout_masks.safetensors (the keep
// masks drawn, uint8, when dropout > 0), conventions.json (the configuration
// and every convention needed to reproduce the numbers: layout, GELU form,
// LayerNorm eps, attention scale and masks, dropout RNG, loss reduction, init).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "harness/device.hpp"
#include "harness/step/step_config.hpp"

namespace hr {

struct DumpResult {
  std::vector<std::string> files;  // paths written
  double loss = 0;
  int64_t tensors = 0;             // tensors written over all files
  int64_t gradient_values = 0;     // over every gradient tensor
  int64_t nonfinite_gradients = 0; // of which inf or NaN
  bool loss_scaled = false;        // fp16 with the loss scaler on: non-finite gradients skip the step
};

// Validates cfg (InvalidArgument naming the field), builds the model from
// cfg.init_seed, draws one batch from data_seed, runs forward + backward (no
// optimizer step) and writes the files.
DumpResult dump_model(Device& dev, const StepConfig& cfg, const std::string& out_dir, uint64_t data_seed = 1);

}  // namespace hr
