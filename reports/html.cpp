// HTML escaping and number formatting for the report.
#include "reports/html.hpp"

#include <fmt/format.h>

#include <cmath>

namespace hr::report {

std::string esc(std::string_view s) {
  std::string out;
  out.reserve(s.size() + s.size() / 8);
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string esc_breakable(std::string_view s) {
  std::string out;
  size_t from = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '_' && s[i] != '/') continue;
    out += esc(s.substr(from, i + 1 - from));
    out += "<wbr>";
    from = i + 1;
  }
  return out + esc(s.substr(from));
}

std::string fmt_num(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  if (v == 0) return "0";
  const double a = std::fabs(v);
  if (a < 1e-3 || a >= 1e7) return fmt::format("{:.3g}", v);
  if (a >= 1000 && std::floor(v) == v) {
    // Thousands separators for whole numbers.
    std::string digits = fmt::format("{:.0f}", a), out;
    for (size_t i = 0; i < digits.size(); ++i) {
      if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
      out += digits[i];
    }
    return (v < 0 ? "-" : "") + out;
  }
  return fmt::format("{:.4g}", v);
}

std::string fmt_si(double v) {
  if (!std::isfinite(v)) return fmt_num(v);
  const double a = std::fabs(v);
  if (a >= 1e9) return fmt::format("{:.3g}G", v / 1e9);
  if (a >= 1e6) return fmt::format("{:.3g}M", v / 1e6);
  if (a >= 1e4) return fmt::format("{:.3g}k", v / 1e3);
  if (a == 0) return "0";
  if (a < 1e-2) return fmt::format("{:.2g}", v);
  if (std::floor(v) == v) return fmt::format("{:.0f}", v);  // 1024, not 1.02e+03
  return fmt::format("{:.3g}", v);
}

std::string fmt_bytes_short(double v) {
  if (!std::isfinite(v)) return fmt_num(v);
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  double a = std::fabs(v);
  while (a >= 1024.0 && u < 4) {
    a /= 1024.0;
    ++u;
  }
  const double s = v < 0 ? -a : a;
  if (u == 0) return fmt::format("{:.0f} B", s);
  return fmt::format("{:.3g} {}", s, units[u]);
}

std::string fmt_seconds(double v) {
  if (!std::isfinite(v)) return fmt_num(v);
  const double a = std::fabs(v);
  if (a == 0) return "0 s";
  if (a < 1e-6) return fmt::format("{:.3g} ns", v * 1e9);
  if (a < 1e-3) return fmt::format("{:.3g} us", v * 1e6);
  if (a < 1) return fmt::format("{:.3g} ms", v * 1e3);
  return fmt::format("{:.3g} s", v);
}

std::string fmt_pct(double f) {
  if (!std::isfinite(f)) return std::isnan(f) ? "n/a" : (f > 0 ? "+inf" : "-inf");
  return fmt::format("{:+.1f}%", f * 100.0);
}

}  // namespace hr::report
