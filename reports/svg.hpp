// Inline SVG charts for the report: a line chart (linear or log axes) and a stacked
// bar chart. Plain strings, no scripts, no fonts or images fetched: the report
// must open offline and show everything without JavaScript. Every label passes
// through esc(); hover titles are native <title> elements.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace hr::report {

enum class AxisFormat { number, bytes, seconds };

struct Series {
  std::string name;  // legend text
  std::vector<std::pair<double, double>> points;  // (x, y); non-finite or, on log axes, non-positive are dropped
  std::string color;  // CSS colour; empty = from the palette
  bool dashed = false;
};

struct ChartOptions {
  std::string title;
  std::string x_label, y_label;
  bool log_x = false, log_y = false;
  AxisFormat x_format = AxisFormat::number, y_format = AxisFormat::number;
  int width = 550, height = 330;
};

// Colour-blind-safe palette (Okabe-Ito order), reused for series in order.
const std::vector<std::string>& palette();

std::string line_chart(const std::vector<Series>& series, const ChartOptions& opt);

struct Bar {
  std::string label;           // under the bar
  std::vector<double> values;  // one per segment, stacked bottom-up
};
// Horizontal stacked bars, one row per Bar; segment_names and colors give the
// legend (one per value). The value axis uses opt.y_format and opt.y_label.
std::string stacked_bar_chart(const std::vector<std::string>& segment_names, const std::vector<std::string>& colors,
                              const std::vector<Bar>& bars, const ChartOptions& opt);

// Axis tick positions (exposed for tests): "nice" linear ticks covering [lo, hi],
// or log ticks (powers of 2 or 10 and their multiples) for positive ranges.
std::vector<double> linear_ticks(double lo, double hi, int target = 5);
std::vector<double> log_ticks(double lo, double hi);
// Linear ticks at nice steps of the range's binary unit (B, KiB, MiB, ...).
std::vector<double> bytes_ticks(double lo, double hi);
// Log ticks at powers of two (bytes on a log axis), at most about six.
std::vector<double> log2_ticks(double lo, double hi);

}  // namespace hr::report
