// The data-parallel section: bytes per rank, communication, bus bandwidth.
#include "reports/parts.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "harness/fit.hpp"
#include "harness/memory.hpp"
#include "reports/html.hpp"
#include "reports/svg.hpp"

namespace hr::report::detail {

using nlohmann::json;

// ---- Data parallel (DP-MEM, DP-COMM, BM-DP) -------------------------------------------------

std::string dp_int(const json& j, const char* key) {
  const auto v = num_of(j, {key});
  return v ? fmt::format("{:.0f}", *v) : "-";
}

std::string dp_section(const Results& r) {
  std::string s = section_open("dp", "Data parallel across processes (DP, BM-DP)",
                               "N ranks under mpirun (MPI on CPU ranks, NCCL on GPU ranks): what each rank holds per "
                               "consumer, with AdamW's state unsharded and sharded (ZeRO-1); the bytes each step "
                               "communicates; all-reduce bandwidth (nccl-tests' algbw and busbw) and step time "
                               "against N.");
  std::vector<const SweepPoint*> mem, comm, bm;
  std::string skipped;
  for (const auto& p : r.sweep_points) {
    if (p.sweep != "DP-MEM" && p.sweep != "DP-COMM" && p.sweep != "BM-DP") continue;
    if (!is_ok(p)) {
      if (skipped.empty()) skipped = p.sweep + " " + p.status + ": " + p.reason;
      continue;
    }
    (p.sweep == "DP-MEM" ? mem : p.sweep == "DP-COMM" ? comm : bm).push_back(&p);
  }
  if (mem.empty() && comm.empty() && bm.empty())
    return s + not_measured(skipped.empty() ? "no DP-MEM, DP-COMM or BM-DP sweep points" : skipped) + "</section>";
  if (!skipped.empty()) s += fmt::format(R"(<p class="warn">{}</p>)", esc(skipped));

  s += "<h3>Bytes per consumer per rank</h3>";
  if (mem.empty()) {
    s += not_measured("no DP-MEM sweep points");
  } else {
    s += R"(<table><thead><tr><th>Ranks</th><th>Rank</th><th>Optimizer, sharding</th><th>Model</th>)";
    for (Consumer c : kAllConsumers) s += fmt::format(R"(<th class="num">{}</th>)", esc(consumer_name(c)));
    s += R"(<th class="num">Peak total</th></tr></thead><tbody>)";
    for (const auto* p : mem) {
      s += fmt::format("<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td>", esc(dp_int(p->config, "ranks")),
                       esc(dp_int(p->config, "rank")),
                       esc(p->config.contains("sharding")
                               ? fmt::format("adamw, {} ({})", str_of(p->config, "sharding"), p->dtype)
                               : str_of(p->config, "optimizer")),
                       esc(p->model));
      for (Consumer c : kAllConsumers)
        s += fmt::format(R"(<td class="num">{}</td>)", esc(fmt_bytes_short(static_cast<double>(p->memory.current(c)))));
      s += fmt::format(R"(<td class="num">{}</td></tr>)",
                       esc(fmt_bytes_short(static_cast<double>(p->memory.total_peak_bytes))));
    }
    s += "</tbody></table><p class=\"lead\" style=\"margin-top:8px\">Held after two steps (weights, gradients, "
         "optimizer state); peak total includes the step's activations and workspace.</p>";
  }

  s += "<h3>Communication per step</h3>";
  if (comm.empty()) {
    s += not_measured("no DP-COMM sweep points");
  } else {
    s += R"(<table><thead><tr><th>Ranks</th><th>Engine</th><th>Synchronisation</th><th>Model</th>)"
         R"(<th class="num">Micro-batches per rank</th><th class="num">Collectives</th>)"
         R"(<th class="num">Gradient bytes</th><th class="num">All bytes</th><th class="num">Bus bytes</th></tr></thead><tbody>)";
    for (const auto* p : comm)
      s += fmt::format(
          R"(<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td class="num">{}</td><td class="num">{}</td>)"
          R"(<td class="num">{}</td><td class="num">{}</td><td class="num">{}</td></tr>)",
          esc(dp_int(p->config, "ranks")), esc(str_of(p->config, "engine")), esc(str_of(p->config, "sync")),
          esc(p->model), esc(dp_int(p->config, "micro_batches_per_rank")), esc(dp_int(p->metrics, "collectives_per_step")),
          esc(fmt_bytes_short(num_of(p->metrics, {"gradient_payload_bytes_per_step"}).value_or(NAN))),
          esc(fmt_bytes_short(num_of(p->metrics, {"payload_bytes_per_step"}).value_or(NAN))),
          esc(fmt_bytes_short(num_of(p->metrics, {"bus_bytes_per_step"}).value_or(NAN))));
    s += "</tbody></table><p class=\"lead\" style=\"margin-top:8px\">Bytes by nccl-tests' definitions: the message "
         "size of each collective (all-gather: its output), and what crosses the busiest link of a ring "
         "(all-reduce 2 (N-1)/N of it, all-gather and reduce-scatter (N-1)/N; a reduce-scatter's size is its input). "
         "Synchronisation zero1, zero2, zero3: the sharded step's ZeRO stage.</p>";
  }

  s += "<h3>BM-DP</h3>";
  if (bm.empty()) {
    s += not_measured("no BM-DP sweep points");
  } else {
    s += R"(<table><thead><tr><th>Engine</th><th>Ranks</th><th>What</th><th class="num">Median time</th>)"
         R"(<th class="num">algbw</th><th class="num">busbw</th><th class="num">Throughput</th></tr></thead><tbody>)";
    for (const auto* p : bm) {
      const auto bytes = num_of(p->config, {"bytes"});
      std::string what = bytes ? "all-reduce " + fmt_bytes_short(*bytes) : str_of(p->config, "what");
      if (const auto buckets = num_of(p->config, {"buckets"}); buckets && !bytes) {
        const auto ov = p->config.find("overlap");
        const bool overlapped = ov != p->config.end() && ov->is_boolean() && ov->get<bool>();
        what += fmt::format(", {} bucket{}{}", *buckets, *buckets == 1 ? "" : "s",
                            overlapped ? " overlapped with the backward" : " after the backward");
      }
      const auto alg = num_of(p->metrics, {"algbw_GBps"}), bus = num_of(p->metrics, {"busbw_GBps"});
      const auto tok = num_of(p->metrics, {"tokens_per_s"});
      s += fmt::format(
          R"(<tr><td>{}</td><td>{}</td><td>{}</td><td class="num">{}</td><td class="num">{}</td><td class="num">{}</td><td class="num">{}</td></tr>)",
          esc(str_of(p->config, "engine")), esc(dp_int(p->config, "ranks")), esc(what),
          esc(p->time ? fmt_seconds(p->time->median_s) : "-"), esc(alg ? fmt::format("{:.3g} GB/s", *alg) : "-"),
          esc(bus ? fmt::format("{:.3g} GB/s", *bus) : "-"), esc(tok ? fmt_si(*tok) + " tok/s" : "-"));
    }
    s += "</tbody></table>";
  }
  return s + "</section>";
}

}  // namespace hr::report::detail
