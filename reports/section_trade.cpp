// The trade section: the field guide's order applied cumulatively (TRADE) and the
// largest micro-batch that fits (BM-FIT).
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

// ---- Trade table ---------------------------------------------------------------------------

// The BM-FIT point of a trade row (same config.key), if the run has one.
const SweepPoint* fit_point_for(const Results& r, const SweepPoint& trade) {
  const std::string key = str_of(trade.config, "key");
  if (key.empty()) return nullptr;
  for (const auto& p : r.sweep_points)
    if (p.sweep == "BM-FIT" && str_of(p.config, "key") == key) return &p;
  return nullptr;
}

// One row's bytes by consumer, e.g. "W 3.6M G 3.6M O 7.2M A 172M WS 30M".
std::string consumer_bytes_cell(const SweepPoint& p) {
  static const std::pair<const char*, Consumer> keys[] = {{"W", Consumer::weights},
                                                          {"G", Consumer::gradients},
                                                          {"O", Consumer::optimizer_state},
                                                          {"A", Consumer::activations},
                                                          {"WS", Consumer::workspace}};
  std::string out;
  for (const auto& [abbr, c] : keys) {
    if (!out.empty()) out += " ";
    out += fmt::format("{}&nbsp;{}", abbr, esc(fmt_bytes_short(static_cast<double>(p.memory.peak(c)))));
  }
  return out;
}

// The loss column: error / bound against the reference, and a mark when the row breaks training.
std::string trade_loss_cell(const SweepPoint& p) {
  const auto err = num_of(p.metrics, {"loss_error"});
  const auto bound = num_of(p.metrics, {"loss_bound"});
  if (!err || !bound) return "-";
  const std::string ref = str_of(p.metrics, "loss_reference");
  const bool within = *err <= *bound;
  const std::string badge = within ? R"(<span class="badge b-ok">trains</span>)"
                                   : R"(<span class="badge b-bad">breaks training</span>)";
  std::string cell = fmt::format("{} {} of bound", badge, esc(fmt_num(*err / (*bound > 0 ? *bound : 1))));
  if (!ref.empty() && ref != "baseline") cell += fmt::format(" <span class=\"muted\">(vs {})</span>", esc(ref));
  return cell;
}

std::string trade_fit_cell(const Results& r, const SweepPoint& p) {
  const SweepPoint* f = fit_point_for(r, p);
  std::optional<double> mb = f && is_ok(*f) ? num_of(f->metrics, {"fit_micro_batch"}) : num_of(p.metrics, {"fit_micro_batch"});
  if (!mb) return f && !is_ok(*f) ? esc(f->status) : "-";
  std::string cell = fmt_num(*mb);
  if (f && f->metrics.value("at_search_cap", false)) cell = "&ge; " + cell;
  if (f) {
    if (auto model = num_of(f->metrics, {"predicted_fit_micro_batch"}); model && *model != *mb)
      cell += fmt::format(" <span class=\"badge b-bad\">model {}</span>", esc(fmt_num(*model)));
  }
  return cell;
}

// TRADE's rows (pts: its points, in the order emitted), as a table and its legend.
static std::string trade_table(const Results& r, const std::vector<const SweepPoint*>& pts) {
  std::string s;
  const SweepPoint* first = nullptr;
  for (const auto* p : pts)
    if (is_ok(*p)) { first = p; break; }
  double max_peak = 0;
  for (const auto* p : pts) max_peak = std::max(max_peak, static_cast<double>(p->memory.total_peak_bytes));
  auto rest_of = [](const SweepPoint& p) {
    json rest = p.config;
    if (rest.is_object()) rest.erase("technique"), rest.erase("step"), rest.erase("key");
    return rest;
  };
  bool any_config = false;
  for (const auto* p : pts) any_config = any_config || !config_label(rest_of(*p)).empty();
  const std::string cfg_th = any_config ? "<th>Config</th>" : "";
  // Ten columns that fit 1280 px: each pair of related numbers shares a cell.
  s += R"(<div class="scroll"><table class="trade"><thead><tr><th>#</th><th>Step</th>)" + cfg_th +
       R"(<th class="num">Peak bytes</th><th>By consumer</th><th class="num">Saved<br><small>vs previous / start</small></th>)"
       R"(<th class="num">Step time<br><small>vs start</small></th><th class="num">Throughput<br><small>all / useful tokens</small></th>)"
       R"(<th>Loss vs baseline</th><th class="num">Fits<br><small>micro-batch</small></th><th>Status</th></tr></thead><tbody>)";
  const SweepPoint* prev = nullptr;
  int n = 0;
  for (const auto* p : pts) {
    ++n;
    std::string label = str_of(p->config, "technique");
    if (label.empty()) label = str_of(p->config, "step");
    const json rest = rest_of(*p);
    if (!is_ok(*p)) {
      s += fmt::format(R"(<tr><td>{}</td><td><b>{}</b></td>{}<td colspan="7"></td><td><span class="badge b-warn">{}</span> {}</td></tr>)",
                       n, esc(label), any_config ? "<td class=\"mono\">" + esc(config_label(rest)) + "</td>" : "",
                       esc(p->status), esc(p->reason));
      continue;
    }
    const double peak = static_cast<double>(p->memory.total_peak_bytes);
    auto saved = [&](const SweepPoint* ref) -> std::string {
      if (!ref || ref == p || ref->memory.total_peak_bytes == 0) return "-";
      return fmt_pct(1.0 - peak / static_cast<double>(ref->memory.total_peak_bytes)).substr(0);
    };
    std::string tvs = "-";
    if (first && first != p && first->time && p->time && first->time->median_s > 0)
      tvs = fmt_pct(p->time->median_s / first->time->median_s - 1.0);
    std::string thr = "-";
    if (auto t = num_of(p->metrics, {"tokens_per_s"})) thr = fmt_si(*t) + " tok/s";
    else if (auto t2 = num_of(p->metrics, {"samples_per_s"})) thr = fmt_si(*t2) + " samples/s";
    std::string useful = "-";
    if (auto u = num_of(p->metrics, {"useful_tokens_per_s"})) useful = fmt_si(*u) + " tok/s";
    const double w = max_peak > 0 ? 90.0 * peak / max_peak : 0;
    // The step's name up to its parenthesis; the details on hover.
    const std::string name = label.substr(0, label.find(" ("));
    s += fmt::format(
        R"(<tr><td>{}</td><td title="{}"><b>{}</b>{}</td>{}<td class="num nw">{}<br><span class="bar" style="width:{:.0f}px"></span></td>)"
        R"(<td class="mono">{}</td><td class="num nw">{}<br>{}</td><td class="num nw">{}<br>{}</td>)"
        R"(<td class="num nw">{}<br>{}</td><td>{}</td><td class="num">{}</td><td><span class="badge b-ok">ok</span></td></tr>)",
        n, esc(label), esc(name),
        name.size() < label.size() ? "<br><small>" + esc(label.substr(name.size() + 2, label.size() - name.size() - 3)) + "</small>"
                                   : std::string(),
        any_config ? "<td class=\"mono\">" + esc(config_label(rest)) + "</td>" : "", esc(fmt_bytes_short(peak)), w,
        consumer_bytes_cell(*p), esc(saved(prev)), esc(saved(first)),
        esc(p->time ? fmt_seconds(p->time->median_s) : "-"), esc(tvs), esc(thr), esc(useful), trade_loss_cell(*p),
        trade_fit_cell(r, *p));
    prev = p;
  }
  s += "</tbody></table></div><p class=\"lead\" style=\"margin-top:8px\">Saved: positive = less memory. Time: positive = "
       "slower. The first two steps of the guide should save memory and time; the next three trade time for memory. "
       "Loss: the difference of the loss after the steps from the reference's, over the reference's progress, as a "
       "fraction of TRADE's bound; a row over it is marked as breaking training. By consumer: W weights, G gradients, "
       "O optimizer state, A activations, WS workspace (the batch included).</p>";
  return s;
}

// BM-FIT: how each budget was set and what the search found; "" without its points.
static std::string fit_table(const Results& r) {
  std::string s;
  std::vector<const SweepPoint*> fits;
  for (const auto& p : r.sweep_points)
    if (p.sweep == "BM-FIT") fits.push_back(&p);
  if (!fits.empty()) {
    s += R"(<h3>Largest micro-batch that fits (BM-FIT)</h3><table><thead><tr><th>Step</th><th class="num">Budget</th>)"
         R"(<th class="num">Found</th><th class="num">Memory model</th><th class="num">Probes</th>)"
         R"(<th class="num">Peak at fit</th><th class="num">Safety margin</th></tr></thead><tbody>)";
    for (const auto* f : fits) {
      const json& b = f->config.contains("budget_bytes") ? f->config["budget_bytes"] : json();
      const std::string budget = b.is_number() ? fmt_bytes_short(b.get<double>()) : (b.is_string() ? b.get<std::string>() : "-");
      auto num = [&](const char* k) { auto v = num_of(f->metrics, {k}); return v ? fmt_num(*v) : std::string("-"); };
      auto bytes = [&](const char* k) { auto v = num_of(f->metrics, {k}); return v ? fmt_bytes_short(*v) : std::string("-"); };
      std::string margin = bytes("safety_margin_bytes");
      if (auto fr = num_of(f->metrics, {"safety_margin_fraction"})) margin += " (" + fmt_pct(*fr) + ")";
      if (!is_ok(*f)) {
        s += fmt::format(R"(<tr><td>{}</td><td class="num">{}</td><td colspan="5"><span class="badge b-warn">{}</span> {}</td></tr>)",
                         esc(str_of(f->config, "technique")), esc(budget), esc(f->status), esc(f->reason));
        continue;
      }
      s += fmt::format(R"(<tr><td>{}</td><td class="num">{}</td><td class="num">{}</td><td class="num">{}</td>)"
                       R"(<td class="num">{}</td><td class="num">{}</td><td class="num">{}</td></tr>)",
                       esc(str_of(f->config, "technique")), esc(budget), esc(num("fit_micro_batch")),
                       esc(num("predicted_fit_micro_batch")), esc(num("probes")), esc(bytes("peak_bytes_at_fit")),
                       esc(margin));
    }
    s += "</tbody></table><p class=\"lead\" style=\"margin-top:8px\">Found: galloping then bisection over real steps "
         "(an out-of-memory, from the tracker's budget on the CPU or the device on a GPU, is &quot;does not fit&quot;). "
         "Memory model: MEM-1's prediction of the same answer. Safety margin: what the found micro-batch leaves of "
         "the budget.</p>";
  }
  return s;
}

std::string trade_section(const Results& r) {
  std::string s = section_open("trade", "The trade: memory saved against time paid (TRADE, BM-FIT)",
                               "The field guide's order applied cumulatively to one configuration: mixed precision, "
                               "sequence length and padding, accumulation, checkpointing, 8-bit optimizer, LoRA. "
                               "Each row adds one technique to the rows above it; all measured on this device: peak "
                               "bytes by consumer, step time, useful (non-pad) tokens/s, the loss after a few steps "
                               "against the baseline's, and the largest micro-batch that fits the budget (BM-FIT).");
  std::vector<const SweepPoint*> pts;
  for (const auto& p : r.sweep_points)
    if (p.sweep == "TRADE") pts.push_back(&p);
  // The rows need TRADE; BM-FIT's table stands without them (a run of BM-FIT alone).
  if (pts.empty())
    s += not_measured("no TRADE sweep points");
  else
    s += trade_table(r, pts);
  return s + fit_table(r) + "</section>";
}

}  // namespace hr::report::detail
