// JUnit XML from a run (and its comparison against a baseline), for CI pages that
// show which check failed: one test case per conformance measurement (named by its
// check key, classname its property ID) and one per sweep point (classname its
// sweep). Without a comparison a measurement fails when it failed in the run, a
// point when it ended in error; with one, the comparison's verdict decides: a check
// of the baseline that is missing from the run is a failing case, a sweep point
// that regressed or is missing fails with the reason. Skipped specs and points are
// <skipped/> cases with their reason.
#pragma once

#include <string>

#include "harness/results/compare.hpp"
#include "harness/results/results.hpp"

namespace hr {

// The XML document (UTF-8; characters XML 1.0 cannot hold are replaced by '?').
std::string junit_xml(const Results& run, const Comparison* comparison = nullptr);

// Writes junit_xml to path through write_output (harness/output.hpp).
void write_junit(const std::string& path, const Results& run, const Comparison* comparison = nullptr);

}  // namespace hr
