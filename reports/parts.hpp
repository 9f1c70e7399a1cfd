// The report's parts: the shared toolkit every section file uses (reports/common.cpp)
// and the sections render_report assembles (reports/section_*.cpp). Internal to the
// report: nothing outside reports/ includes it.
#pragma once

#include <nlohmann/json.hpp>

#include <functional>
#include <initializer_list>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "harness/results/results.hpp"
#include "reports/report.hpp"
#include "reports/svg.hpp"

namespace hr::report::detail {

// ---- Readers of results fields (common.cpp) ----
// The first of `keys` that holds a number (or a number written as a string).
std::optional<double> num_of(const nlohmann::json& j, std::initializer_list<const char*> keys);
// A field as text ("" when absent or null; non-strings as JSON).
std::string str_of(const nlohmann::json& j, const char* key);
// Catalogue order of the field guide's families, then the number.
std::pair<int, int> id_order(const std::string& id);
int dtype_order(const std::string& d);
bool is_ok(const SweepPoint& p);

// ---- Page frame ----
extern const char* kCss;
std::string section_open(const char* id, const std::string& title, const std::string& lead);
std::string not_measured(const std::string& what);
// A label for people from a config, naming only what `varying` (the keys whose
// values differ among the points shown together) holds, values only when the
// chart names the keys: "memory_efficient 512"; null values are left out.
std::string short_config_label(const nlohmann::json& config, const std::set<std::string>& varying, bool with_keys);
// A title cut at a word boundary to at most `max_chars` (the whole title when it fits).
std::string short_title(const std::string& title, size_t max_chars);

// ---- Series from sweep points ----
std::vector<Series> make_series(const std::vector<const SweepPoint*>& pts, std::initializer_list<const char*> x_keys,
                                const std::set<std::string>& ignore,
                                const std::function<std::optional<double>(const SweepPoint&)>& y_of);
std::vector<const SweepPoint*> points_of(const Results& r, std::initializer_list<const char*> sweeps);
std::optional<double> activation_peak(const SweepPoint& p);
void add_exponents(std::vector<Series>& series);  // the fitted exponent of each series, in its legend
const std::vector<std::string>& consumer_colors();

// ---- Conformance numbers (section_conformance.cpp) ----
double headroom_ratio(const Measurement& m);  // tolerance / error for a check, error / tolerance for a control
std::string ratio_text(double h);
std::string status_badge(const Measurement& m);  // passed / FAILED / caught / error, as a badge
struct PropertyPower {
  std::optional<double> power;
  int controls = 0, subtle_caught = 0;
};
// The smallest caught power of an ID's checks (on one backend and dtype, or all when empty).
PropertyPower property_power(const std::vector<Measurement>& ms, const std::string& id, const std::string& backend,
                             const std::string& dtype);

// ---- Sections ----
std::string summary(const Results& r, const ReportOptions& opt);
std::string device_section(const Results& r);
std::string conformance_section(const Results& r);
std::string memory_section(const Results& r);
std::string curve_bm_mb(const Results& r);
// The device time by op of the profiled points among `pts` (HEADROOM_OP_PROFILE), as a
// table; "" where none was profiled.
std::string op_time_tables(const std::vector<const SweepPoint*>& pts);
std::string curve_ck3(const Results& r);
std::string curve_seq(const Results& r);
std::string curve_q83(const Results& r);
std::string curve_mp(const Results& r);
std::string trade_section(const Results& r);
std::string dp_section(const Results& r);
std::string peer_section(const ReportOptions& opt);
std::string baseline_section(const Results& r, const ReportOptions& opt);
std::string run_section(const Results& r);

}  // namespace hr::report::detail
