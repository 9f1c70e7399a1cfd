// Console text (see text.hpp).
#include "harness/text.hpp"

namespace hr {

std::vector<std::string> wrap_text(const std::string& text, size_t width, size_t indent, bool indent_first) {
  if (indent >= width) indent = 0;
  if (indent_first) {
    std::vector<std::string> lines = wrap_text(text, width - indent, 0);
    for (std::string& l : lines) l = std::string(indent, ' ') + l;
    return lines;
  }
  std::vector<std::string> lines{""};
  size_t at = 0;
  while (at < text.size()) {
    size_t end = text.find(' ', at);
    if (end == std::string::npos) end = text.size();
    std::string word = text.substr(at, end - at);
    at = end + 1;
    if (word.empty()) continue;
    const size_t room = width - (lines.size() == 1 ? 0 : indent);
    if (!lines.back().empty() && lines.back().size() + 1 + word.size() > room) lines.emplace_back();
    while (word.size() > width - indent) {  // a word that fits no line: cut it
      const size_t used = lines.back().empty() ? 0 : lines.back().size() + 1;
      const size_t fits = width - indent > used ? width - indent - used : 1;
      lines.back() += (lines.back().empty() ? "" : " ") + word.substr(0, fits);
      word = word.substr(fits);
      lines.emplace_back();
    }
    lines.back() += (lines.back().empty() ? "" : " ") + word;
  }
  for (size_t i = 1; i < lines.size(); ++i) lines[i] = std::string(indent, ' ') + lines[i];
  return lines;
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> parts;
  size_t a = 0;
  for (;;) {
    const size_t b = s.find(sep, a);
    parts.push_back(s.substr(a, b == std::string::npos ? std::string::npos : b - a));
    if (b == std::string::npos) return parts;
    a = b + 1;
  }
}

}  // namespace hr
