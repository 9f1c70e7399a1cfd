// The HTML report: one self-contained file (inline CSS, inline SVG, no scripts, no
// network) made from a Results, optionally with a baseline comparison and its
// verdict. Every string that came from outside (device names, ids, configs,
// reasons) is escaped.
//
// What the curve sections read from sweep points (reports/README.md has the table):
//   BM-MB         config.micro_batch; metrics.tokens_per_s (or samples_per_s, else
//                 1 / time.median_s); memory.total_peak_bytes
//   CK-3          config.depth (or layers); activation peak; series = other config keys
//   PK-4, BM-SEQ  config.seq_len (or seq, T); activation peak; series = other keys
//   Q8-3          config.step; metrics.loss; series = other keys (e.g. optimizer), or a
//                 Q8-3 measurement whose details.curve = {"x": [...], "series": {name: [...]}}
//   TRADE         one point per cumulative step in the field guide's order; label from
//                 config.technique (or step), then memory and time
// A section whose data is absent says "not measured in this run".
#pragma once

#include <string>

#include "harness/results/compare.hpp"
#include "harness/results/results.hpp"

namespace hr::report {

struct ReportOptions {
  const Results* baseline = nullptr;      // with comparison: the baseline section
  const Comparison* comparison = nullptr;
  std::string baseline_source;            // shown beside the baseline (e.g. its path)
  const nlohmann::json* peer = nullptr;   // ci/peer/torch_step.py's record: the peer section
};

std::string render_report(const Results& r, const ReportOptions& opt = {});

// The ids of the report's sections, in order (the tests check each is present).
const char* const kSectionIds[] = {"summary", "conformance", "memory", "curve-bm-mb", "curve-ck-3", "curve-seq",
                                   "curve-q8-3", "trade", "peer", "baseline", "device", "run"};

}  // namespace hr::report
