// Inline SVG charts: axes with nice ticks (linear or log), polylines with point
// markers, stacked bars, and a legend that wraps. Sizes are in CSS pixels.
#include "reports/svg.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "reports/html.hpp"

namespace hr::report {

namespace {

constexpr double kCharW = 6.6;  // approximate width of one 12px sans-serif glyph

std::string axis_text(double v, AxisFormat f) {
  switch (f) {
    case AxisFormat::bytes: return fmt_bytes_short(v);
    case AxisFormat::seconds: return fmt_seconds(v);
    case AxisFormat::number: break;
  }
  return fmt_si(v);
}

std::string truncate(const std::string& s, size_t n) {
  if (s.size() <= n) return s;
  return s.substr(0, n - 1) + "\u2026";
}

struct LegendItem {
  std::string name, color;
  bool dashed = false;
  bool box = false;  // a filled box (bars) instead of a line (series)
};

// Legend laid out in rows inside [x0, x0 + width); returns the SVG and its height.
std::pair<std::string, double> legend(const std::vector<LegendItem>& items, double x0, double y0, double width) {
  std::string out;
  double x = x0, y = y0 + 12;
  int rows = items.empty() ? 0 : 1;
  for (const auto& it : items) {
    const std::string name = truncate(it.name, 60);
    const double w = 26 + kCharW * static_cast<double>(name.size()) + 16;
    if (x > x0 && x + w > x0 + width) {
      x = x0;
      y += 18;
      ++rows;
    }
    if (it.box) {
      out += fmt::format(R"(<rect x="{:.1f}" y="{:.1f}" width="14" height="10" rx="2" fill="{}"/>)", x + 2, y - 9,
                         esc(it.color));
    } else {
      out += fmt::format(R"(<line x1="{:.1f}" y1="{:.1f}" x2="{:.1f}" y2="{:.1f}" stroke="{}" stroke-width="2.5"{}/>)",
                         x, y - 4, x + 20, y - 4, esc(it.color), it.dashed ? R"( stroke-dasharray="5 3")" : "");
      out += fmt::format(R"(<circle cx="{:.1f}" cy="{:.1f}" r="3" fill="{}"/>)", x + 10, y - 4, esc(it.color));
    }
    out += fmt::format(R"(<text x="{:.1f}" y="{:.1f}" class="lg">{}</text>)", x + 26, y, esc(name));
    x += w;
  }
  return {out, rows * 18.0};
}

std::string svg_open(int width, double height, const std::string& title) {
  return fmt::format(
      R"(<svg xmlns="http://www.w3.org/2000/svg" class="chart" width="{}" height="{:.0f}" viewBox="0 0 {} {:.0f}" role="img" aria-label="{}">)"
      R"(<style>text{{font:12px system-ui,-apple-system,"Segoe UI",Roboto,Helvetica,Arial,sans-serif;fill:#334155}})"
      R"(.tt{{font-size:13px;font-weight:600;fill:#0f172a}}.ax{{fill:#64748b;font-size:11px}}.lg{{font-size:12px}})"
      R"(.grid{{stroke:#e2e8f0;stroke-width:1}}.axis{{stroke:#94a3b8;stroke-width:1}}</style>)",
      width, height, width, height, esc(title));
}

}  // namespace

const std::vector<std::string>& palette() {
  static const std::vector<std::string> p = {"#0072B2", "#E69F00", "#009E73", "#CC79A7",
                                             "#56B4E9", "#D55E00", "#7F7F7F", "#332288"};
  return p;
}

std::vector<double> linear_ticks(double lo, double hi, int target) {
  std::vector<double> t;
  if (!std::isfinite(lo) || !std::isfinite(hi)) return t;
  if (hi < lo) std::swap(lo, hi);
  if (hi == lo) return {lo};
  const double raw = (hi - lo) / std::max(1, target);
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double r = raw / mag;
  const double step = (r <= 1 ? 1 : r <= 2 ? 2 : r <= 5 ? 5 : 10) * mag;
  for (double v = std::ceil(lo / step - 1e-9) * step; v <= hi + step * 1e-9; v += step)
    t.push_back(std::fabs(v) < step * 1e-9 ? 0.0 : v);
  return t;
}

std::vector<double> bytes_ticks(double lo, double hi) {
  // Nice steps in the binary unit of the range (64 MiB, not 67.1 MB).
  double unit = 1;
  while (std::max(std::fabs(lo), std::fabs(hi)) / unit >= 1024 && unit < 1099511627776.0) unit *= 1024;
  auto t = linear_ticks(lo / unit, hi / unit, 5);
  for (auto& v : t) v *= unit;
  return t;
}

std::vector<double> log2_ticks(double lo, double hi) {
  std::vector<double> t;
  if (!(lo > 0) || !(hi > lo) || !std::isfinite(hi)) return log_ticks(lo, hi);
  const int k0 = static_cast<int>(std::ceil(std::log2(lo) - 1e-9)), k1 = static_cast<int>(std::floor(std::log2(hi) + 1e-9));
  if (k1 < k0) return log_ticks(lo, hi);
  const int step = std::max(1, (k1 - k0 + 5) / 6);  // at most ~6 ticks
  for (int k = k1; k >= k0; k -= step) t.insert(t.begin(), std::ldexp(1.0, k));
  return t;
}

std::vector<double> log_ticks(double lo, double hi) {
  std::vector<double> t;
  if (!(lo > 0) || !(hi > 0) || !std::isfinite(lo) || !std::isfinite(hi)) return t;
  if (hi < lo) std::swap(lo, hi);
  const int k0 = static_cast<int>(std::floor(std::log10(lo))), k1 = static_cast<int>(std::ceil(std::log10(hi)));
  auto within = [&](double v) { return v >= lo * (1 - 1e-9) && v <= hi * (1 + 1e-9); };
  for (int k = k0; k <= k1; ++k)
    if (within(std::pow(10.0, k))) t.push_back(std::pow(10.0, k));
  if (t.size() < 3) {
    std::set<double> s(t.begin(), t.end());
    for (int k = k0; k <= k1; ++k)
      for (double m : {2.0, 5.0})
        if (within(m * std::pow(10.0, k))) s.insert(m * std::pow(10.0, k));
    t.assign(s.begin(), s.end());
  }
  if (t.size() < 2) t = {lo, hi};
  return t;
}

std::string line_chart(const std::vector<Series>& series_in, const ChartOptions& opt) {
  // Keep only the points each axis can show.
  std::vector<Series> series = series_in;
  for (auto& s : series) {
    std::vector<std::pair<double, double>> keep;
    for (const auto& [x, y] : s.points) {
      if (!std::isfinite(x) || !std::isfinite(y)) continue;
      if ((opt.log_x && x <= 0) || (opt.log_y && y <= 0)) continue;
      keep.emplace_back(x, y);
    }
    std::sort(keep.begin(), keep.end());
    s.points = std::move(keep);
  }
  std::vector<LegendItem> items;
  for (size_t i = 0; i < series.size(); ++i) {
    if (series[i].color.empty()) series[i].color = palette()[i % palette().size()];
    items.push_back({series[i].name, series[i].color, series[i].dashed, false});
  }

  const double ml = 74, mr = 30, mt = 30;  // mr: room for the last x tick label
  const double plot_w = opt.width - ml - mr;
  const auto [legend_svg_probe, legend_h] = legend(items, ml, 0, plot_w);
  (void)legend_svg_probe;
  const double mb = 44 + (legend_h > 0 ? legend_h + 8 : 0);
  const double height = opt.height + (legend_h > 0 ? legend_h + 8 : 0);
  const double plot_h = height - mt - mb;

  std::string out = svg_open(opt.width, height, opt.title);
  out += fmt::format(R"(<text x="{:.1f}" y="18" class="tt">{}</text>)", ml, esc(opt.title));

  double x_lo = INFINITY, x_hi = -INFINITY, y_lo = INFINITY, y_hi = -INFINITY;
  std::set<double> xs;
  for (const auto& s : series)
    for (const auto& [x, y] : s.points) {
      x_lo = std::min(x_lo, x), x_hi = std::max(x_hi, x);
      y_lo = std::min(y_lo, y), y_hi = std::max(y_hi, y);
      xs.insert(x);
    }
  if (xs.empty()) {
    out += fmt::format(R"(<rect x="{:.1f}" y="{:.1f}" width="{:.1f}" height="{:.1f}" fill="#f8fafc" stroke="#e2e8f0"/>)",
                       ml, mt, plot_w, plot_h);
    out += fmt::format(R"(<text x="{:.1f}" y="{:.1f}" text-anchor="middle" class="ax">no data</text></svg>)",
                       ml + plot_w / 2, mt + plot_h / 2);
    return out;
  }
  if (!opt.log_y && y_lo >= 0) y_lo = 0;  // linear magnitudes read best from zero
  auto widen = [](double& lo, double& hi, bool log) {
    if (hi > lo) return;
    if (log) lo /= 2, hi *= 2;
    else if (lo == 0) hi = 1;
    else lo -= std::fabs(lo) * 0.5, hi += std::fabs(hi) * 0.5;
  };
  widen(x_lo, x_hi, opt.log_x);
  widen(y_lo, y_hi, opt.log_y);
  if (opt.log_y) y_lo /= 1.12, y_hi *= 1.12;  // markers clear of the frame

  std::vector<double> xt = opt.log_x ? (xs.size() <= 10 && xs.size() >= 2 ? std::vector<double>(xs.begin(), xs.end())
                                                                          : log_ticks(x_lo, x_hi))
                                     : linear_ticks(x_lo, x_hi, 6);
  std::vector<double> yt = opt.log_y && opt.y_format == AxisFormat::bytes ? log2_ticks(y_lo, y_hi)
                           : opt.log_y                         ? log_ticks(y_lo, y_hi)
                           : opt.y_format == AxisFormat::bytes ? bytes_ticks(y_lo, y_hi)
                                                               : linear_ticks(y_lo, y_hi, 5);
  // Let the axes cover their outer ticks.
  if (!opt.log_y && !yt.empty()) y_hi = std::max(y_hi, yt.back()), y_lo = std::min(y_lo, yt.front());
  if (!opt.log_x && !xt.empty()) x_hi = std::max(x_hi, xt.back()), x_lo = std::min(x_lo, xt.front());

  auto tx = [&](double x) {
    const double a = opt.log_x ? std::log(x) : x, lo = opt.log_x ? std::log(x_lo) : x_lo,
                 hi = opt.log_x ? std::log(x_hi) : x_hi;
    return ml + (hi > lo ? (a - lo) / (hi - lo) : 0.5) * plot_w;
  };
  auto ty = [&](double y) {
    const double a = opt.log_y ? std::log(y) : y, lo = opt.log_y ? std::log(y_lo) : y_lo,
                 hi = opt.log_y ? std::log(y_hi) : y_hi;
    return mt + plot_h - (hi > lo ? (a - lo) / (hi - lo) : 0.5) * plot_h;
  };

  for (double v : yt) {
    if (v < y_lo * (1 - 1e-9) - 1e-300 || v > y_hi * (1 + 1e-9) + 1e-300) continue;
    const double y = ty(v);
    out += fmt::format(R"(<line x1="{:.1f}" y1="{:.1f}" x2="{:.1f}" y2="{:.1f}" class="grid"/>)", ml, y, ml + plot_w, y);
    out += fmt::format(R"(<text x="{:.1f}" y="{:.1f}" text-anchor="end" class="ax">{}</text>)", ml - 6, y + 4,
                       esc(axis_text(v, opt.y_format)));
  }
  for (double v : xt) {
    const double x = tx(v);
    out += fmt::format(R"(<line x1="{:.1f}" y1="{:.1f}" x2="{:.1f}" y2="{:.1f}" class="grid"/>)", x, mt, x, mt + plot_h);
    out += fmt::format(R"(<text x="{:.1f}" y="{:.1f}" text-anchor="middle" class="ax">{}</text>)", x, mt + plot_h + 15,
                       esc(axis_text(v, opt.x_format)));
  }
  out += fmt::format(R"(<line x1="{0:.1f}" y1="{1:.1f}" x2="{2:.1f}" y2="{1:.1f}" class="axis"/>)", ml, mt + plot_h,
                     ml + plot_w);
  out += fmt::format(R"(<line x1="{0:.1f}" y1="{1:.1f}" x2="{0:.1f}" y2="{2:.1f}" class="axis"/>)", ml, mt, mt + plot_h);
  out += fmt::format(R"(<text x="{:.1f}" y="{:.1f}" text-anchor="middle" class="ax">{}{}</text>)", ml + plot_w / 2,
                     mt + plot_h + 32, esc(opt.x_label), opt.log_x ? " (log scale)" : "");
  out += fmt::format(R"~(<text transform="translate(14 {:.1f}) rotate(-90)" text-anchor="middle" class="ax">{}{}</text>)~",
                     mt + plot_h / 2, esc(opt.y_label), opt.log_y ? " (log)" : "");

  for (const auto& s : series) {
    if (s.points.empty()) continue;
    std::string pts;
    for (const auto& [x, y] : s.points) pts += fmt::format("{:.1f},{:.1f} ", tx(x), ty(y));
    out += fmt::format(R"(<polyline points="{}" fill="none" stroke="{}" stroke-width="2.2" stroke-linejoin="round"{}/>)",
                       pts, esc(s.color), s.dashed ? R"( stroke-dasharray="6 4")" : "");
    const bool markers = s.points.size() <= 40;
    for (const auto& [x, y] : s.points) {
      if (!markers) break;
      out += fmt::format(R"(<circle cx="{:.1f}" cy="{:.1f}" r="3.2" fill="#fff" stroke="{}" stroke-width="2">)"
                         R"(<title>{}: {} = {}, {} = {}</title></circle>)",
                         tx(x), ty(y), esc(s.color), esc(s.name), esc(opt.x_label), esc(axis_text(x, opt.x_format)),
                         esc(opt.y_label), esc(axis_text(y, opt.y_format)));
    }
  }
  out += legend(items, ml, mt + plot_h + 40, plot_w).first;
  out += "</svg>";
  return out;
}

std::string stacked_bar_chart(const std::vector<std::string>& names, const std::vector<std::string>& colors,
                              const std::vector<Bar>& bars, const ChartOptions& opt) {
  // Horizontal bars: configuration labels read left to right, however long.
  std::vector<LegendItem> items;
  for (size_t i = 0; i < names.size(); ++i)
    items.push_back({names[i], i < colors.size() ? colors[i] : palette()[i % palette().size()], false, true});
  // Labels are never cut: one longer than a line takes two, broken at a space, and
  // the left margin grows to the longest line (up to kMaxLabelChars).
  constexpr size_t kMaxLabelChars = 30;
  std::vector<std::vector<std::string>> label_lines;
  size_t longest = 4;
  bool two = false;
  for (const auto& b : bars) {
    std::vector<std::string> ls{b.label};
    if (b.label.size() > kMaxLabelChars) {
      size_t cut = b.label.rfind(' ', b.label.size() / 2 + 4);
      if (cut == std::string::npos || cut == 0) cut = b.label.find(' ');
      if (cut != std::string::npos) ls = {b.label.substr(0, cut), b.label.substr(cut + 1)};
    }
    for (const auto& l : ls) longest = std::max(longest, l.size());
    two = two || ls.size() > 1;
    label_lines.push_back(std::move(ls));
  }
  const double ml = 14 + kCharW * static_cast<double>(longest), mr = 64;  // room for the total
  const double plot_w = std::max(120.0, opt.width - ml - mr);
  const double width = ml + plot_w + mr;
  const auto [lg, legend_h] = legend(items, 16, 26, width - 32.0);
  const double mt = 30 + legend_h + 10;
  const double row_h = two ? 32 : 24;
  const double plot_h = std::max<double>(1, static_cast<double>(bars.size())) * row_h;
  const double height = mt + plot_h + 44;

  std::string out = svg_open(width, height, opt.title);
  out += fmt::format(R"(<text x="16" y="18" class="tt">{}</text>)", esc(opt.title));
  out += lg;

  double top = 0;
  for (const auto& b : bars) {
    double s = 0;
    for (double v : b.values) s += std::isfinite(v) && v > 0 ? v : 0;
    top = std::max(top, s);
  }
  if (bars.empty() || top <= 0) {
    out += fmt::format(R"(<text x="{:.1f}" y="{:.1f}" text-anchor="middle" class="ax">no data</text></svg>)",
                       ml + plot_w / 2, mt + plot_h / 2);
    return out;
  }
  const auto xt = opt.y_format == AxisFormat::bytes ? bytes_ticks(0, top) : linear_ticks(0, top, 5);
  const double x_hi = std::max(top, xt.empty() ? top : xt.back());
  auto tx = [&](double v) { return ml + v / x_hi * plot_w; };
  for (double v : xt) {
    out += fmt::format(R"(<line x1="{0:.1f}" y1="{1:.1f}" x2="{0:.1f}" y2="{2:.1f}" class="grid"/>)", tx(v), mt,
                       mt + plot_h);
    out += fmt::format(R"(<text x="{:.1f}" y="{:.1f}" text-anchor="middle" class="ax">{}</text>)", tx(v),
                       mt + plot_h + 15, esc(axis_text(v, opt.y_format)));
  }
  out += fmt::format(R"(<text x="{:.1f}" y="{:.1f}" text-anchor="middle" class="ax">{}</text>)", ml + plot_w / 2,
                     mt + plot_h + 34, esc(opt.y_label));
  const double bh = 15;
  for (size_t i = 0; i < bars.size(); ++i) {
    const double cy = mt + row_h * (static_cast<double>(i) + 0.5);
    double acc = 0;
    std::string tip = bars[i].label;
    for (size_t k = 0; k < bars[i].values.size(); ++k) {
      const double v = std::isfinite(bars[i].values[k]) && bars[i].values[k] > 0 ? bars[i].values[k] : 0;
      if (k < names.size()) tip += fmt::format("\n{}: {}", names[k], axis_text(v, opt.y_format));
      if (v <= 0) continue;
      out += fmt::format(R"(<rect x="{:.1f}" y="{:.1f}" width="{:.1f}" height="{:.1f}" fill="{}"/>)", tx(acc),
                         cy - bh / 2, std::max(0.5, tx(acc + v) - tx(acc)), bh,
                         esc(k < colors.size() ? colors[k] : palette()[k % palette().size()]));
      acc += v;
    }
    // One transparent rect over the whole row carries the hover title.
    out += fmt::format(R"(<rect x="{:.1f}" y="{:.1f}" width="{:.1f}" height="{:.1f}" fill="transparent"><title>{}</title></rect>)",
                       ml, cy - row_h / 2, plot_w, row_h, esc(tip));
    const auto& ls = label_lines[i];
    for (size_t k = 0; k < ls.size(); ++k)
      out += fmt::format(R"(<text x="{:.1f}" y="{:.1f}" text-anchor="end" class="ax">{}</text>)", ml - 8,
                         cy + 4 + (static_cast<double>(k) - (static_cast<double>(ls.size()) - 1) / 2) * 12, esc(ls[k]));
    out += fmt::format(R"(<text x="{:.1f}" y="{:.1f}" class="ax">{}</text>)", tx(acc) + 5, cy + 4,
                       esc(axis_text(acc, opt.y_format)));
  }
  out += fmt::format(R"(<line x1="{0:.1f}" y1="{1:.1f}" x2="{0:.1f}" y2="{2:.1f}" class="axis"/>)", ml, mt, mt + plot_h);
  out += "</svg>";
  return out;
}

}  // namespace hr::report
