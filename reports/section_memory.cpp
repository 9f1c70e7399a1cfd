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
    // Label bars by the config keys that vary within the sweep (all, when none varies).
    std::map<std::string, std::set<std::string>> key_values;
    for (const auto* p : pts)
      for (auto it = p->config.begin(); it != p->config.end(); ++it) key_values[it.key()].insert(it->dump());
    auto varying_label = [&](const json& config) {
      json v = json::object();
      for (auto it = config.begin(); it != config.end(); ++it)
        if (key_values[it.key()].size() > 1) v[it.key()] = *it;
      return config_label(v.empty() ? config : v);
    };
    std::vector<Bar> bars;
    for (size_t i = 0; i < pts.size() && i < kMaxBars; ++i) {
      const auto* p = pts[i];
      std::string label;
      for (const auto& [set, v] : {std::make_pair(&md, p->model), std::make_pair(&be, p->backend),
                                   std::make_pair(&dt, p->dtype)})
        if (set->size() > 1 && !v.empty()) label += (label.empty() ? "" : " ") + v;
      // A named step (TRADE) reads better by its name than by its config.
      const std::string technique = str_of(p->config, "technique");
      const std::string cfg = technique.empty() ? varying_label(p->config) : technique;
      if (!cfg.empty()) label += (label.empty() ? "" : " ") + cfg;
      Bar b{label.empty() ? std::to_string(i + 1) : label, {}};
      for (Consumer c : kAllConsumers) b.values.push_back(static_cast<double>(p->memory.peak(c)));
      bars.push_back(std::move(b));
    }
    ChartOptions o;
    o.title = sw + (pts.size() > kMaxBars ? fmt::format(" (first {} of {})", kMaxBars, pts.size()) : "");
    o.y_label = "peak bytes";
    o.y_format = AxisFormat::bytes;
    o.width = 550;
    s += stacked_bar_chart(names, consumer_colors(), bars, o);
  }
  s += "</div></section>";
  return s;
}

}  // namespace hr::report::detail
