// Optimizers over a model's parameters (fp32 master weights, fp32 gradients),
// with their state charged to Consumer::optimizer_state. SGD (with optional
// momentum) and AdamW come from kernels/optim; other optimizers (8-bit AdamW)
// plug in through the Optimizer interface and StepConfig::optimizer.factory.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "harness/models/params.hpp"
#include "kernels/optim/optim.hpp"

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
};

enum class OptimizerKind : uint8_t { sgd, adamw, custom };
const char* optimizer_kind_name(OptimizerKind k);  // "sgd" | "adamw" | "custom"

struct OptimizerConfig {
  OptimizerKind kind = OptimizerKind::adamw;
  ops::SgdConfig sgd;
  ops::AdamWConfig adamw;
  // kind == custom: builds the optimizer for a parameter set (e.g. 8-bit AdamW).
  std::function<std::unique_ptr<Optimizer>(ParamSet&)> factory;
};

// State is allocated here, for every trainable parameter.
std::unique_ptr<Optimizer> make_optimizer(const OptimizerConfig& cfg, ParamSet& params);

}  // namespace hr
