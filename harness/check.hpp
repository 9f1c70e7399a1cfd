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

[[noreturn]] inline void throw_at(const char* file, int line, const std::string& what) {
  throw Error(fmt::format("{} ({}:{})", what, file, line));
}

}  // namespace hr

// HR_CHECK(cond, "format {}", args...): throws hr::Error naming the condition,
// the message, the file and the line.
#define HR_CHECK(cond, ...)                                                              \
  do {                                                                                   \
    if (!(cond))                                                                         \
      ::hr::throw_at(__FILE__, __LINE__,                                                 \
                     fmt::format("check failed: {}: {}", #cond, fmt::format(__VA_ARGS__))); \
  } while (0)

// HR_ARG_CHECK: as HR_CHECK for user input; throws hr::InvalidArgument.
#define HR_ARG_CHECK(cond, ...)                                  \
  do {                                                           \
    if (!(cond)) throw ::hr::InvalidArgument(fmt::format(__VA_ARGS__)); \
  } while (0)
