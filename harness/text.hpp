// Text for people on a console: lines of at most a width, broken at spaces; and
// lists in one string (CUDA_VISIBLE_DEVICES, CTest's allocations) cut at a separator.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace hr {

// The console width every command's own lines keep to.
inline constexpr size_t kConsoleColumns = 120;

// `text` in lines of at most `width` columns, broken at spaces (a word longer than a
// line is cut), every line after the first indented by `indent` spaces; with
// indent_first, the first too.
std::vector<std::string> wrap_text(const std::string& text, size_t width, size_t indent = 0,
                                   bool indent_first = false);

// `s` cut at every `sep`: each field, empty ones included ("" gives one empty field).
std::vector<std::string> split(const std::string& s, char sep);

}  // namespace hr
