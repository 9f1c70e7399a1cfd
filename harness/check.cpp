// Messages of errors (see check.hpp).
#include "harness/check.hpp"

#include <atomic>
#include <cstdlib>
#include <cstring>

namespace hr {
namespace {

std::atomic<bool>& debug_state() {
  static std::atomic<bool> on{[] {
    const char* v = std::getenv("HEADROOM_DEBUG");
    return v != nullptr && *v != '\0' && std::strcmp(v, "0") != 0;
  }()};
  return on;
}

}  // namespace

bool debug_messages() { return debug_state().load(); }
void set_debug_messages(bool on) { debug_state().store(on); }

std::string error_text(const std::exception& e) {
  if (const auto* internal = dynamic_cast<const InternalError*>(&e); internal != nullptr && debug_messages())
    return fmt::format("{} [{}]", e.what(), internal->where());
  return e.what();
}

}  // namespace hr
