// Shared pieces of the accumulation and batch-norm properties (GA-*, BN-*) and of
// the micro-batch sweep (BM-MB): the small configurations they run at a fixed
// effective batch, their batches, and per-tensor comparisons of named tensors.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "harness/data/batch.hpp"
#include "harness/registry.hpp"
#include "harness/step/train_step.hpp"

namespace hr::props {

// docs/catalogue.md GA-1: the effective batch is fixed, the micro-batch varies.
inline constexpr int64_t kEffectiveBatch = 32;
// The micro-batch sizes GA-1 compares against the full batch (K = 32 / micro_batch).
std::vector<int64_t> accum_micro_batches();

// A step configuration for the accumulation properties: dropout p = 0 (no mask is
// drawn, so the comparison isolates accumulation; GA-6 turns dropout on, with
// masks keyed by sample), SGD, fp16 with the default dynamic loss scaler (a power
// of two, so scaling itself is exact).
StepConfig accum_mlp_config(DType dtype, int64_t micro_batch, Preset preset, NormKind norm = NormKind::none);
StepConfig accum_transformer_config(DType dtype, int64_t micro_batch, Preset preset);

// A batch of kEffectiveBatch rows for `cfg`. Transformer rows are full length
// (every row has seq_len - 1 real targets, so per-micro-batch means weight every
// token alike) unless `lengths` gives each row's length (padding, GA-4).
Batch accum_batch(Device& dev, const StepConfig& cfg, uint64_t seed, const std::vector<int64_t>& lengths = {});

using NamedValues = std::vector<std::pair<std::string, std::vector<float>>>;
NamedValues gradient_values(const TrainStep& step);
NamedValues parameter_values(TrainStep& step);   // fp32 master copies
NamedValues buffer_values(TrainStep& step);      // BatchNorm running statistics

// Parameters whose exact gradient is zero whatever the data, so that what is
// computed for them is rounding noise (~1e-9 of the other gradients) and a
// relative error of noise against noise means nothing:
// - transformer: the attention key bias adds q . b_k to every score of a query
//   row, a constant the row softmax removes;
// - MLP with BatchNorm: the bias of a linear layer feeding BatchNorm is removed
//   with the batch mean (per micro-batch and per virtual batch alike).
// These are compared against the norm of the whole reference instead (and
// reported as such). The rule names the tensors explicitly rather than guessing
// from small norms, so a real error in a small tensor is still seen.
using ZeroGradientRule = std::function<bool(const std::string& param_name)>;
ZeroGradientRule exact_zero_gradients(const StepConfig& cfg);

// Norm-wise relative L2 per tensor, ||got - ref|| / ||ref||, and its maximum over
// tensors (tensors the rule names divide by the norm of all of `ref`). A NaN or
// inf anywhere makes the error NaN. The reference must have a non-zero norm.
struct TensorsCompare {
  double max_rel_l2 = 0;
  std::string worst;            // the tensor with the largest error
  double global_rel_l2 = 0;     // over all tensors concatenated
  double got_norm = 0, ref_norm = 0;  // of all tensors concatenated
  nlohmann::json per_tensor = nlohmann::json::object();
};
TensorsCompare compare_tensors(const NamedValues& got, const NamedValues& ref, const ZeroGradientRule& zero = {});

// The measurement fields every property here fills the same way.
void describe(Measurement& m, const Device& dev, DType dtype, const std::string& model);

// A check and the negative controls aimed at it, written once. Every measurement it
// adds to `out` carries the device, dtype and model (describe), the check's metric,
// tolerance and the tolerance's reason; each control names the check it must trip
// (Measurement::control_of). The reference returned is out.back(), valid until the
// next measurement is added.
class CheckFamily {
 public:
  CheckFamily(std::vector<Measurement>& out, const Device& dev, DType dtype, std::string model, std::string id,
              std::string title, double tolerance, std::string metric, std::string reason);

  Measurement& check(double error, nlohmann::json config = nlohmann::json::object(),
                     nlohmann::json details = nlohmann::json::object());
  Measurement& gross(std::string title, double error, nlohmann::json config = nlohmann::json::object(),
                     nlohmann::json details = nlohmann::json::object());
  Measurement& subtle(std::string title, double error, nlohmann::json config = nlohmann::json::object(),
                      nlohmann::json details = nlohmann::json::object());

  // check_name(id, title): what the controls name.
  std::string name() const { return check_name(id_, title_); }

 private:
  Measurement& add(Measurement m, nlohmann::json config, nlohmann::json details);

  std::vector<Measurement>& out_;
  const Device& dev_;
  DType dtype_;
  std::string model_, id_, title_;
  double tolerance_;
  std::string metric_, reason_;
};

// A registered property's body: fn on the run's device for fp32, fp16 and bf16.
using PerDTypeProperty = std::vector<Measurement> (*)(Device&, DType, Preset, uint64_t);
std::vector<Measurement> every_float_dtype(RunContext& ctx, PerDTypeProperty fn);

}  // namespace hr::props
