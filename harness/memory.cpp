// MemoryTracker: consumer-tagged accounting, budget and fault injection.
#include "harness/memory.hpp"

#include <fmt/format.h>

#include "harness/check.hpp"

namespace hr {

const char* consumer_name(Consumer c) {
  switch (c) {
    case Consumer::weights: return "weights";
    case Consumer::gradients: return "gradients";
    case Consumer::optimizer_state: return "optimizer_state";
    case Consumer::activations: return "activations";
    case Consumer::workspace: return "workspace";
  }
  return "?";
}

void MemoryTracker::reserve(size_t bytes, Consumer c) {
  std::lock_guard<std::mutex> lock(mu_);
  if (fail_countdown_ > 0 && --fail_countdown_ == 0) {
    throw OutOfMemory(fmt::format("injected allocation failure ({} for {})", format_bytes(bytes),
                                  consumer_name(c)));
  }
  if (budget_ && s_.total_current_bytes + bytes > *budget_) {
    throw OutOfMemory(fmt::format("out of memory: {} for {} would exceed the budget of {} ({} in use)",
                                  format_bytes(bytes), consumer_name(c), format_bytes(*budget_),
                                  format_bytes(s_.total_current_bytes)));
  }
  const int i = static_cast<int>(c);
  s_.current_bytes[i] += bytes;
  s_.total_current_bytes += bytes;
  if (s_.current_bytes[i] > s_.peak_bytes[i]) s_.peak_bytes[i] = s_.current_bytes[i];
  if (s_.total_current_bytes > s_.total_peak_bytes) s_.total_peak_bytes = s_.total_current_bytes;
  ++s_.allocations;
  ++s_.live_allocations;
  if (s_.live_allocations > s_.peak_live_allocations) s_.peak_live_allocations = s_.live_allocations;
}

void MemoryTracker::unreserve(size_t bytes, Consumer c) noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  s_.current_bytes[static_cast<int>(c)] -= bytes;
  s_.total_current_bytes -= bytes;
  --s_.allocations;
  --s_.live_allocations;
}

void MemoryTracker::release(size_t bytes, Consumer c) noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  s_.current_bytes[static_cast<int>(c)] -= bytes;
  s_.total_current_bytes -= bytes;
  --s_.live_allocations;
}

MemorySnapshot MemoryTracker::snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  return s_;
}

void MemoryTracker::reset_peak() {
  std::lock_guard<std::mutex> lock(mu_);
  s_.peak_bytes = s_.current_bytes;
  s_.total_peak_bytes = s_.total_current_bytes;
  s_.peak_live_allocations = s_.live_allocations;
}

void MemoryTracker::set_budget(std::optional<size_t> bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  budget_ = bytes;
}

std::optional<size_t> MemoryTracker::budget() const {
  std::lock_guard<std::mutex> lock(mu_);
  return budget_;
}

void MemoryTracker::fail_nth_allocation(uint64_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  fail_countdown_ = n;
}

std::string format_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024.0 && u < 4) {
    bytes /= 1024.0;
    ++u;
  }
  return u == 0 ? fmt::format("{:.0f} B", bytes) : fmt::format("{:.2f} {}", bytes, units[u]);
}

}  // namespace hr
