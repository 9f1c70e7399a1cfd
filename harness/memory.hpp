// Memory accounting by consumer. Every buffer headroom allocates goes through one
// MemoryTracker per Device, tagged with the consumer it belongs to: the four
// consumers of a training step (weights, gradients, optimizer state, activations
// kept for the backward pass) plus workspace for temporaries. The tracker keeps
// current and peak bytes per consumer and in total, enforces an optional budget
// (to emulate a smaller card) and can fail the Nth allocation (fault injection).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>

namespace hr {

enum class Consumer : uint8_t { weights, gradients, optimizer_state, activations, workspace };
inline constexpr int kNumConsumers = 5;
inline constexpr Consumer kAllConsumers[] = {Consumer::weights, Consumer::gradients,
                                             Consumer::optimizer_state, Consumer::activations,
                                             Consumer::workspace};

const char* consumer_name(Consumer c);  // "weights", "gradients", ...

struct MemorySnapshot {
  std::array<size_t, kNumConsumers> current_bytes{};
  std::array<size_t, kNumConsumers> peak_bytes{};  // per consumer, each its own high-water mark
  size_t total_current_bytes = 0;
  size_t total_peak_bytes = 0;  // high-water mark of the sum (not the sum of the peaks)
  uint64_t allocations = 0;     // successful allocations since construction
  uint64_t live_allocations = 0;
  uint64_t peak_live_allocations = 0;  // most allocations alive at once (reset with the peaks)

  size_t current(Consumer c) const { return current_bytes[static_cast<int>(c)]; }
  size_t peak(Consumer c) const { return peak_bytes[static_cast<int>(c)]; }
};

class MemoryTracker {
 public:
  // Accounts for an allocation of `bytes` about to be made. Throws OutOfMemory
  // (and records nothing) when it would exceed the budget or when it is the
  // injected failure.
  void reserve(size_t bytes, Consumer c);
  // Undoes reserve() when the real allocation then failed.
  void unreserve(size_t bytes, Consumer c) noexcept;
  void release(size_t bytes, Consumer c) noexcept;

  MemorySnapshot snapshot() const;
  // Peaks become the current values (per consumer and total).
  void reset_peak();

  // Budget on the total current bytes; nullopt = unlimited.
  void set_budget(std::optional<size_t> bytes);
  std::optional<size_t> budget() const;

  // Fail the nth allocation from now (1 = the next one); 0 disarms.
  void fail_nth_allocation(uint64_t n);

 private:
  mutable std::mutex mu_;
  MemorySnapshot s_;
  std::optional<size_t> budget_;
  uint64_t fail_countdown_ = 0;
};

// Human-readable byte count ("1.50 MiB").
std::string format_bytes(double bytes);

}  // namespace hr
