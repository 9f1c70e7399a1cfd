// Errors: every failure in headroom is an exception that names what failed and
// where. Library code never calls exit(); destructors never throw.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace hr {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// An allocation past the memory budget, an injected allocation failure, or a
// real out-of-memory from the device. Recoverable: nothing is leaked.
class OutOfMemory : public Error {
 public:
  using Error::Error;
};

// Bad user input (configuration, files, command-line values).
class InvalidArgument : public Error {
 public:
  using Error::Error;
};

// A property or sweep that cannot run on this machine (a prerequisite is missing,
// e.g. no mpirun for the data-parallel entries). The runner records the spec as
// skipped with this reason: neither a pass nor an error, and a comparison counts a
// check of the baseline that this run skipped as missing unless the baseline
// skipped it for the same reason.
class Skipped : public Error {
 public:
  using Error::Error;
};

// An internal check that failed (HR_CHECK): what() is the message for people; the
// condition and the source location are kept apart, for --debug (error_text).
class InternalError : public Error {
 public:
  InternalError(const std::string& what, std::string where) : Error(what), where_(std::move(where)) {}
  const std::string& where() const { return where_; }

 private:
  std::string where_;
};

[[noreturn]] inline void throw_at(const char* file, int line, const char* cond, const std::string& what) {
  throw InternalError(what, fmt::format("check failed: {} ({}:{})", cond, file, line));
}

// Whether messages carry the source locations of internal checks: `headroom --debug`
// or HEADROOM_DEBUG=1 in the environment.
bool debug_messages();
void set_debug_messages(bool on);

// e.what(), with an internal check's condition and source location under --debug.
std::string error_text(const std::exception& e);

}  // namespace hr

// HR_CHECK(cond, "format {}", args...): throws hr::InternalError with the message,
// keeping the condition, the file and the line for --debug.
#define HR_CHECK(cond, ...)                                                          \
  do {                                                                               \
    if (!(cond)) ::hr::throw_at(__FILE__, __LINE__, #cond, fmt::format(__VA_ARGS__)); \
  } while (0)

// HR_ARG_CHECK: as HR_CHECK for user input; throws hr::InvalidArgument.
#define HR_ARG_CHECK(cond, ...)                                  \
  do {                                                           \
    if (!(cond)) throw ::hr::InvalidArgument(fmt::format(__VA_ARGS__)); \
  } while (0)
