// Optimizers over a model's parameters (fp32 master weights, fp32 gradients),
// with their state charged to Consumer::optimizer_state. SGD (with optional
// momentum) and AdamW come from kernels/optim; other optimizers (8-bit AdamW)
// plug in through the Optimizer interface and StepConfig::optimizer.factory.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "harness/models/params.hpp"
#include "kernels/optim/optim.hpp"
#include "kernels/optim/optim8.hpp"

namespace hr {

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  virtual std::string name() const = 0;
  // Updates every trainable parameter's master copy from its gradient. `step` is
  // 1-based and counts applied (not skipped) steps.
  virtual void step(ParamSet& params, int64_t step) = 0;
  // Bytes of optimizer state it holds (what Consumer::optimizer_state should show).
  virtual size_t state_bytes() const = 0;
  // Named state tensors (for dumps and bitwise "untouched" checks).
  virtual std::vector<std::pair<std::string, Tensor>> state() const = 0;
  // A checkpoint of the state, as a file holds it: each state tensor's name and raw
  // bytes in state()'s order; load() fills an optimizer built for the same
  // parameters from one (InvalidArgument when the names or sizes differ).
  using Saved = std::vector<std::pair<std::string, std::vector<uint8_t>>>;
  virtual Saved save() const;
  virtual void load(const Saved& saved);
};

// adamw8bit: AdamW with block-wise 8-bit moments (kernels/optim/optim8.hpp);
// tensors under q8::kMin8bitNumel elements keep fp32 moments.
enum class OptimizerKind : uint8_t { sgd, adamw, custom, adamw8bit };
const char* optimizer_kind_name(OptimizerKind k);  // "sgd" | "adamw" | "custom" | "adamw8bit"

struct OptimizerConfig {
  OptimizerKind kind = OptimizerKind::adamw;
  ops::SgdConfig sgd;
  ops::AdamWConfig adamw;  // also the hyperparameters of adamw8bit
  ops::AdamW8bitOptions adamw8bit;
  // kind == custom: builds the optimizer for a parameter set (e.g. 8-bit AdamW).
  std::function<std::unique_ptr<Optimizer>(ParamSet&)> factory;
};

// Bytes of 8-bit AdamW state for one tensor of `numel` elements: codes for both
// moments plus one fp32 absmax per block per moment, or fp32 moments below
// q8::kMin8bitNumel elements.
size_t adamw8bit_state_bytes(int64_t numel, int64_t block_size);

// State is allocated here, for every trainable parameter.
std::unique_ptr<Optimizer> make_optimizer(const OptimizerConfig& cfg, ParamSet& params);

}  // namespace hr
