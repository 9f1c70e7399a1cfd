// The memory section: peak bytes by consumer per sweep, as stacked bars.
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

// ---- Memory by consumer ----------------------------------------------------------------


std::string memory_section(const Results& r) {
  std::string s = section_open("memory", "Memory by consumer",
                               "Peak bytes per consumer, as the tracking allocator measured them for each "
                               "configuration: weights, gradients, optimizer state, activations kept for the "
                               "backward pass, and workspace. Each consumer's peak is its own high-water mark.");
  std::vector<std::string> sweeps;
  for (const auto& p : r.sweep_points)
    if (is_ok(p) && p.memory.total_peak_bytes > 0 && std::find(sweeps.begin(), sweeps.end(), p.sweep) == sweeps.end())
      sweeps.push_back(p.sweep);
  if (sweeps.empty()) {
    s += not_measured("no sweep point recorded memory");
    return s + "</section>";
  }
  std::vector<std::string> names;
  for (Consumer c : kAllConsumers) names.push_back(consumer_name(c));
  s += R"(<div class="charts">)";
  constexpr size_t kMaxBars = 24;
  for (const auto& sw : sweeps) {
    std::vector<const SweepPoint*> pts;
    for (const auto& p : r.sweep_points)
      if (p.sweep == sw && is_ok(p) && p.memory.total_peak_bytes > 0) pts.push_back(&p);
    std::set<std::string> dt, md, be;
    for (const auto* p : pts) dt.insert(p->dtype), md.insert(p->model), be.insert(p->backend);
    // Label bars by what differs between them: the config keys whose values vary in
    // the sweep, values only, the keys named once in the chart's title.
    std::map<std::string, std::set<std::string>> key_values;
    for (const auto* p : pts)
      for (auto it = p->config.begin(); it != p->config.end(); ++it)
        if (it.key() != "technique" && it.key() != "key" && !it->is_null()) key_values[it.key()].insert(it->dump());
    std::set<std::string> varying;
    std::string keys_named;
    for (const auto& [k, vals] : key_values)
      if (vals.size() > 1) varying.insert(k), keys_named += (keys_named.empty() ? "" : ", ") + k;
    auto varying_label = [&](const json& config) { return short_config_label(config, varying, false); };
    std::vector<Bar> bars;
    for (size_t i = 0; i < pts.size() && i < kMaxBars; ++i) {
      const auto* p = pts[i];
      std::string label;
      for (const auto& [set, v] : {std::make_pair(&md, p->model), std::make_pair(&be, p->backend),
                                   std::make_pair(&dt, p->dtype)})
        if (set->size() > 1 && !v.empty()) label += (label.empty() ? "" : " ") + v;
      // A named step (TRADE) reads better by its name (up to its parenthesis) than by its config.
      const std::string technique = str_of(p->config, "technique");
      const std::string cfg = technique.empty() ? varying_label(p->config) : technique.substr(0, technique.find(" ("));
      if (!cfg.empty()) label += (label.empty() ? "" : " ") + cfg;
      Bar b{label.empty() ? std::to_string(i + 1) : label, {}};
      for (Consumer c : kAllConsumers) b.values.push_back(static_cast<double>(p->memory.peak(c)));
      bars.push_back(std::move(b));
    }
    ChartOptions o;
    bool named = false;
    for (const auto* p : pts) named = named || !str_of(p->config, "technique").empty();
    o.title = sw + (named || keys_named.empty() ? "" : " by " + keys_named) +
              (pts.size() > kMaxBars ? fmt::format(" (first {} of {})", kMaxBars, pts.size()) : "");
    o.y_label = "peak bytes";
    o.y_format = AxisFormat::bytes;
    o.width = 550;
    s += stacked_bar_chart(names, consumer_colors(), bars, o);
  }
  s += "</div></section>";
  return s;
}

}  // namespace hr::report::detail
