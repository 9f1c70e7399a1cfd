// Parameters of a controlled model: each has a name, an fp32 master copy (what
// the optimizer updates), the copy the ops read in the compute dtype (the same
// tensor in fp32; a 16-bit copy refreshed after every update otherwise) and an
// fp32 gradient that micro-batches accumulate into. Bytes: master and compute
// copies are Consumer::weights, gradients Consumer::gradients. Initial values are
// drawn on the host from the shared Philox stream, so they do not depend on the
// backend.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "harness/tensor.hpp"

namespace hr {

struct Param {
  std::string name;    // "h.0.attn.q.weight"
  Tensor master;       // fp32 (or the compute dtype when master weights are off)
  Tensor compute;      // what the ops read; shares storage with master when dtypes match
  Tensor grad;         // fp32, same shape; undefined for a frozen parameter
  bool trainable = true;
  bool weight_decay = true;  // false for biases and norm affine parameters
  // How it was initialised, for the conventions file of a dump.
  std::string init;          // "normal(0, 0.02)", "zeros", "ones", ...
};

// How parameters are stored (the precision policy's part that concerns them).
struct ParamStorage {
  DType compute = DType::f32;  // dtype of compute copies and activations
  bool master_weights = true;  // false: the parameter lives only in the compute dtype (MP-4 control)
  // Wrong on purpose (MP-4's subtle control): this one parameter has no fp32 master,
  // as one registered after the optimizer took its copies keeps its 16-bit storage.
  std::string fault_no_master;
  // Wrong on purpose (LR-4's frozen-base controls): this parameter ("*": every one)
  // stays trainable although it is added frozen (LoRA's base left to move).
  std::string fault_not_frozen;
  // Wrong on purpose (LR-1's controls): LoRA's B drawn from normal(0, this) instead of
  // zero, so the adapted model starts away from the base. 0 (off) in a correct init.
  float fault_lora_b_std = 0.f;
  // Wrong on purpose (LR-4's subtle control): this parameter is frozen but still owns
  // a gradient buffer.
  std::string fault_grad_kept;
  // LoRA's B drawn from normal(0, this) instead of zero, on request (adapters.b_init_std):
  // a dump whose A gradients are not zero. 0: LoRA's own init.
  float lora_b_init_std = 0.f;
};

class ParamSet {
 public:
  ParamSet(Device& dev, ParamStorage storage, uint64_t seed) : dev_(&dev), storage_(storage), seed_(seed) {}

  // Adds a parameter initialised from host fp32 values.
  Param& add(std::string name, Shape shape, const std::vector<float>& init_values, std::string init_desc,
             bool weight_decay);
  // Draws normal(0, std) values from the Philox stream of this set's seed; each
  // parameter uses its own stream offset range, so adding a parameter does not
  // change the others.
  Param& add_normal(std::string name, Shape shape, float std, bool weight_decay = true);
  Param& add_uniform(std::string name, Shape shape, float bound, bool weight_decay = true);
  Param& add_const(std::string name, Shape shape, float value, bool weight_decay = false);
  // LoRA's B: zeros (weight decay on), or normal(0, storage().fault_lora_b_std) under
  // that fault, or normal(0, storage().lora_b_init_std) when one is asked for.
  Param& add_lora_b(std::string name, Shape shape);

  std::vector<Param>& all() { return params_; }
  const std::vector<Param>& all() const { return params_; }
  Param& at(const std::string& name);  // throws InvalidArgument naming the parameter
  const Param& at(const std::string& name) const;
  size_t size() const { return params_.size(); }

  int64_t numel() const;            // every parameter
  int64_t trainable_numel() const;  // those with gradients

  void zero_grad();
  // Copies master -> compute after an update (no-op when they share storage).
  void sync_compute();
  // Marks a parameter frozen: drops its gradient buffer.
  void freeze(const std::string& name);
  // Parameters added while this is set are frozen from the start (no gradient buffer).
  void set_add_frozen(bool frozen) { add_frozen_ = frozen; }

  Device& device() const { return *dev_; }
  const ParamStorage& storage() const { return storage_; }
  uint64_t seed() const { return seed_; }

 private:
  Device* dev_;
  ParamStorage storage_;
  uint64_t seed_;
  uint64_t next_stream_ = 0;
  bool add_frozen_ = false;  // index of the next parameter's offset range
  std::vector<Param> params_;
};

// Host draws from the Philox stream (seed, offset): normal by Box-Muller over
// pairs of cuRAND-style uniforms in (0, 1], and uniform in [-bound, bound).
std::vector<float> philox_normal(uint64_t seed, uint64_t offset, int64_t n, float mean, float std);
std::vector<float> philox_uniform(uint64_t seed, uint64_t offset, int64_t n, float lo, float hi);

}  // namespace hr
