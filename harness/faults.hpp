// Fault switches: every broken variant a negative control runs is a switch in the
// code path (the step, a model, a kernel, the communicator, the packer, the
// scaler), read through armed(). Disarming them makes every switch read as off, so
// the same control code runs the correct variant: the power test runs every
// property once disarmed and requires that no control is caught then. A control
// whose fault is arithmetic of the property itself, not a switch, is still
// "caught" with the switches off, and that test names it.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <type_traits>
#include <utility>

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

// A process-wide switch of a family of faults (kernels/common/op_fault.hpp's OpFault,
// kernels/optim/optim8.hpp's Q8Fault) that has no configuration to travel in: set for
// a scope by Scoped<T>, read where the fault acts by active<T>(). Each T's slot is
// defined once, in the .cpp of the code that reads it (HR_DEFINE_FAULT_SLOT), and
// declared in its header (HR_DECLARE_FAULT_SLOT).
template <class T>
struct Slot {
  bool set = false;
  T value{};
  uint64_t uses = 0;  // for faults that act on every other use
};
template <class T>
Slot<T>& slot();

// The switch while it is set and armed, else nullptr.
template <class T>
T* active() {
  Slot<T>& s = slot<T>();
  return s.set && armed() ? &s.value : nullptr;
}

// Sets the switch for its lifetime; one at a time per family.
template <class T>
class Scoped {
 public:
  explicit Scoped(T value) {
    Slot<T>& s = slot<T>();
    if (s.set) throw std::logic_error("a fault switch of this family is already set");
    s.value = std::move(value);
    s.uses = 0;
    s.set = true;
  }
  ~Scoped() { slot<T>() = Slot<T>{}; }
  Scoped(const Scoped&) = delete;
  Scoped& operator=(const Scoped&) = delete;
};

// The environment variable that disarms every switch in a process.
inline constexpr const char* kDisarmEnv = "HEADROOM_FAULTS_DISARMED";

}  // namespace hr::faults

#define HR_DECLARE_FAULT_SLOT(T) \
  template <>                    \
  ::hr::faults::Slot<T>& ::hr::faults::slot<T>()
#define HR_DEFINE_FAULT_SLOT(T)                      \
  template <>                                        \
  ::hr::faults::Slot<T>& ::hr::faults::slot<T>() {   \
    static ::hr::faults::Slot<T> s;                  \
    return s;                                        \
  }
