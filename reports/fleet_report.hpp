// The HTML report of `headroom fleet` (fleet.json, harness/fleet/fleet.hpp): the
// verdict, then one row per device (the flagged ones first) and a column per check
// (runs, digest, own repeat, conformance, throughput), then each device's numbers.
// Self-contained like the run's report: no script, no network.
#pragma once

#include <nlohmann/json.hpp>

#include <string>

namespace hr::report {

std::string render_fleet_report(const nlohmann::json& fleet);

}  // namespace hr::report
