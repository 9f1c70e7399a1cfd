// Numbers in headroom's JSON files (results, baselines, dumps' records): finite
// values as JSON numbers, the non-finite ones explicit, never null.
#pragma once

#include <nlohmann/json.hpp>

namespace hr {

// finite -> number; otherwise the string "nan", "inf" or "-inf".
nlohmann::json json_number(double v);
// The inverse; anything else throws InvalidArgument naming what it got.
double json_to_double(const nlohmann::json& j);

}  // namespace hr
