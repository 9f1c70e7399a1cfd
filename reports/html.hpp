// Small helpers for writing the HTML report by hand: escaping (every string that
// came from outside goes through esc()) and number formatting shared by the
// tables and the SVG charts.
#pragma once

#include <string>
#include <string_view>

namespace hr::report {

// Escapes & < > " ' for use in HTML text and attribute values (and SVG/XML).
std::string esc(std::string_view s);
// esc() for text cells: a line may also break after each '_' and '/' (<wbr>), so
// that a long identifier ("loss_diff_over_reference_progress") does not set its
// column's width. Not for attribute values.
std::string esc_breakable(std::string_view s);

// Compact number: "0", "1.5e-07", "0.0123", "12.3", "1,234", "1.23M".
std::string fmt_num(double v);
// A value with an SI suffix for axes and rates: "950", "12.3k", "4.56M", "1.2G".
std::string fmt_si(double v);
// Bytes in binary units, short: "512 B", "1.5 KiB", "12 MiB", "3.2 GiB".
std::string fmt_bytes_short(double v);
// Seconds in a readable unit: "12.3 us", "4.56 ms", "1.23 s".
std::string fmt_seconds(double v);
// Signed percentage: "+12.3%", "-4.0%".
std::string fmt_pct(double fraction);

}  // namespace hr::report
