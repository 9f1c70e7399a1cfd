// Process-wide kernel call counts (see kernel_calls.hpp).
#include "harness/kernel_calls.hpp"

#include <mutex>

namespace hr {

namespace {
// Never destroyed: a kernel may be counted while statics are torn down at exit.
std::mutex& mu() {
  static std::mutex& m = *new std::mutex;
  return m;
}
KernelCalls& counts() {
  static KernelCalls& c = *new KernelCalls;
  return c;
}
}  // namespace

void count_kernel_call(const char* name) {
  const std::lock_guard<std::mutex> lock(mu());
  ++counts()[name];
}

KernelCalls kernel_calls() {
  const std::lock_guard<std::mutex> lock(mu());
  return counts();
}

std::string kernel_variant(const std::string& name) {
  const auto colon = name.rfind(':');
  return colon == std::string::npos ? name : name.substr(colon + 1);
}

}  // namespace hr
