// Explicit non-finite numbers in JSON (see json_number.hpp).
#include "harness/json_number.hpp"

#include <fmt/format.h>

#include <cmath>
#include <string>

#include "harness/check.hpp"

namespace hr {

nlohmann::json json_number(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return v;
}

double json_to_double(const nlohmann::json& j) {
  if (j.is_number()) return j.get<double>();
  if (j.is_string()) {
    const auto s = j.get<std::string>();
    if (s == "nan") return std::nan("");
    if (s == "inf") return INFINITY;
    if (s == "-inf") return -INFINITY;
  }
  throw InvalidArgument(fmt::format("expected a number or \"nan\"/\"inf\"/\"-inf\", got {}", j.dump()));
}

}  // namespace hr
