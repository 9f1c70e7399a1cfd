// The step digest of `headroom fleet`: fixed-seed training steps that must come out
// bit for bit the same on every device of one kind, driver and build, and on one
// device every time. Each configuration runs a few optimizer steps; after each step
// the loss, every trainable gradient and every updated fp32 master weight is hashed
// (SHA-256 of its bytes). A device whose digest differs from the majority's, or from
// its own second run, computed something wrong: the first (configuration, step,
// tensor) that differs says where.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "harness/device.hpp"
#include "harness/step/step_config.hpp"

namespace hr::fleet {

// SHA-256 of `bytes` bytes at `data`, as 64 lowercase hex digits (OpenSSL's EVP).
std::string sha256_hex(const void* data, size_t bytes);

struct DigestConfig {
  std::string name;  // "fp32_accumulation_checkpointing_dropout", ...
  StepConfig cfg;
  int64_t steps = 0;
};

// The configurations every device runs: accumulation, checkpointing with dropout
// and AdamW in fp32; the same in fp16 with the dynamic loss scaler. Small models:
// the digest is a check of the device, not a benchmark.
std::vector<DigestConfig> digest_configs();

struct TensorDigest {
  std::string name;    // "loss", "grad:<param>", "param:<param>"
  std::string sha256;
};
struct StepDigest {
  std::vector<TensorDigest> tensors;  // in a fixed order
};
struct ConfigDigest {
  std::string name;
  std::vector<StepDigest> steps;
};
struct Digest {
  std::vector<ConfigDigest> configs;
  std::string sha256;  // over every tensor digest in order: the device's one value
  double seconds = 0;  // what computing it took
};

// Runs every digest configuration on dev from `seed` (the same on every device).
Digest compute_digest(Device& dev, uint64_t seed);

// Where two digests first differ, or nullopt when they agree throughout.
struct DigestDifference {
  std::string config;
  int64_t step = 0;  // 1-based
  std::string tensor;
};
std::optional<DigestDifference> first_difference(const Digest& a, const Digest& b);

void to_json(nlohmann::json& j, const Digest& d);
void from_json(const nlohmann::json& j, Digest& d);
nlohmann::json difference_json(const std::optional<DigestDifference>& d);

}  // namespace hr::fleet
