// Fault switches: every broken variant a negative control runs is a switch in the
// code path (the step, a model, a kernel, the communicator, the packer, the
// scaler), read through armed(). Disarming them makes every switch read as off, so
// the same control code runs the correct variant: the power test runs every
// property once disarmed and requires that no control is caught then. A control
// whose fault is arithmetic of the property itself, not a switch, is still
// "caught" with the switches off, and that test names it.
#pragma once

#include <type_traits>

namespace hr::faults {

// True unless disarmed (by Disarmed in this process, or HEADROOM_FAULTS_DISARMED=1
// in the environment, which Disarmed sets so that the ranks mpirun starts inherit it).
bool armed();

// The switch's value while armed, its "off" value (a value-initialised T: none,
// false, 0, an empty name) while disarmed.
template <class T>
T armed(const T& v) {
  static_assert(std::is_default_constructible_v<T>, "a fault switch's off value is its default");
  return armed() ? v : T{};
}

// Disarms every fault switch for its lifetime (not thread-safe against a concurrent
// run: the power test uses it between runs).
class Disarmed {
 public:
  Disarmed();
  ~Disarmed();
  Disarmed(const Disarmed&) = delete;
  Disarmed& operator=(const Disarmed&) = delete;

 private:
  bool was_;
};

// The environment variable that disarms every switch in a process.
inline constexpr const char* kDisarmEnv = "HEADROOM_FAULTS_DISARMED";

}  // namespace hr::faults
