#include "harness/faults.hpp"

#include <atomic>
#include <cstdlib>
#include <cstring>

namespace hr::faults {
namespace {
bool disarmed_by_environment() {
  const char* v = std::getenv(kDisarmEnv);
  return v && std::strcmp(v, "1") == 0;
}
std::atomic<bool>& state() {
  static std::atomic<bool> s{!disarmed_by_environment()};
  return s;
}
}  // namespace

bool armed() { return state().load(std::memory_order_relaxed); }

// The environment says it too, so that processes this one starts (the data-parallel
// ranks under mpirun) run disarmed as well.
Disarmed::Disarmed() : was_(state().exchange(false)) { ::setenv(kDisarmEnv, "1", 1); }
Disarmed::~Disarmed() {
  state().store(was_);
  if (was_) ::unsetenv(kDisarmEnv);
}

}  // namespace hr::faults
