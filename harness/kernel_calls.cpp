// Process-wide kernel call counts (see kernel_calls.hpp).
#include "harness/kernel_calls.hpp"

#include <functional>
#include <mutex>
#include <string_view>

namespace hr {

namespace {
// Never destroyed: a kernel may be counted while statics are torn down at exit.
std::mutex& mu() {
  static std::mutex& m = *new std::mutex;
  return m;
}
// Looked up by the name as given (no string built per call once a name is known).
std::map<std::string, uint64_t, std::less<>>& counts() {
  static auto& c = *new std::map<std::string, uint64_t, std::less<>>;
  return c;
}
std::map<std::string, std::map<std::string, uint64_t>, std::less<>>& fallbacks() {
  static auto& f = *new std::map<std::string, std::map<std::string, uint64_t>, std::less<>>;
  return f;
}
}  // namespace

void count_kernel_call(const char* name) {
  const std::string_view key(name);
  const std::lock_guard<std::mutex> lock(mu());
  auto it = counts().find(key);
  if (it == counts().end()) it = counts().emplace(std::string(key), 0).first;
  ++it->second;
}

KernelCalls kernel_calls() {
  const std::lock_guard<std::mutex> lock(mu());
  return KernelCalls(counts().begin(), counts().end());
}

std::map<std::string, double> kernel_calls_per_run(const KernelCalls& before, const KernelCalls& after, double runs) {
  std::map<std::string, double> per_run;
  for (const auto& [name, n] : after) {
    const auto was = before.find(name);
    const uint64_t ran = n - (was == before.end() ? 0 : was->second);
    if (ran > 0 && runs > 0) per_run[name] = static_cast<double>(ran) / runs;
  }
  return per_run;
}

void count_kernel_fallback(const char* asked, const std::string& why) {
  const std::string_view key(asked);
  const std::lock_guard<std::mutex> lock(mu());
  auto it = fallbacks().find(key);
  if (it == fallbacks().end()) it = fallbacks().emplace(std::string(key), std::map<std::string, uint64_t>{}).first;
  ++it->second[why];
}

KernelFallbacks kernel_fallbacks() {
  const std::lock_guard<std::mutex> lock(mu());
  return KernelFallbacks(fallbacks().begin(), fallbacks().end());
}

std::map<std::string, std::string> kernel_fallbacks_between(const KernelFallbacks& before,
                                                            const KernelFallbacks& after) {
  std::map<std::string, std::string> fell;
  for (const auto& [name, reasons] : after) {
    const auto was = before.find(name);
    std::string why;
    for (const auto& [reason, n] : reasons) {
      uint64_t n0 = 0;
      if (was != before.end())
        if (auto r = was->second.find(reason); r != was->second.end()) n0 = r->second;
      if (n > n0) why += (why.empty() ? "" : "; ") + reason;
    }
    if (!why.empty()) fell[name] = why;
  }
  return fell;
}

}  // namespace hr
