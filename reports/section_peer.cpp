// The PyTorch peer section: the same step timed in PyTorch (ci/peer/torch_step.py,
// one record per form of the step), set against headroom's BM-MB point.
#include "reports/parts.hpp"

#include <fmt/format.h>

#include <string>

#include "reports/html.hpp"

namespace hr::report::detail {

using nlohmann::json;

std::string peer_section(const ReportOptions& opt) {
  std::string s = section_open("peer", "Against PyTorch (the same step)",
                               "The model, dtype, micro-batch and sequence length of this run's largest BM-MB point "
                               "without accumulation (its fastest attention form), timed in PyTorch by "
                               "ci/peer/torch_step.py: as written (eager, with the point's attention) and in the "
                               "fastest form that PyTorch has (fused attention, fused AdamW, bf16 autocast, "
                               "torch.compile). The headline is against the strongest form.");
  if (opt.peer == nullptr) return s + not_measured("no peer record (headroom report --peer results-peer.json)") + "</section>";
  const json& p = *opt.peer;
  const json& forms = p.contains("forms") && p["forms"].is_array() ? p["forms"] : json::array();
  if (forms.empty()) return s + not_measured("the peer record has no forms") + "</section>";
  const json* point = p.contains("headroom_point") && p["headroom_point"].is_object() ? &p["headroom_point"] : nullptr;
  const std::optional<double> measured_tps = point != nullptr ? num_of(*point, {"tokens_per_s"}) : std::nullopt;
  const double headroom_tps = measured_tps.value_or(0.0);  // 0: not measured

  if (point != nullptr) {
    const json& c = (*point)["config"];
    std::string attention = str_of(c, "attention");
    if (const std::string k = str_of(c, "attention_kernel"); !k.empty()) attention += " on " + k;
    s += fmt::format("<p>headroom {} micro-batch {} x {}{}: <b>{:.0f} tokens/s</b>; PyTorch {} on {}.</p>",
                     esc(str_of(*point, "dtype")), esc(str_of(c, "micro_batch")), esc(str_of(c, "seq_len")),
                     attention.empty() ? "" : ", " + esc(attention) + " attention", headroom_tps,
                     esc(str_of(p, "torch")), esc(str_of(p, "device")));
  }
  if (p.contains("headline") && point != nullptr) {
    const auto ratio = num_of(p["headline"], {"headroom_over_peer"});
    if (ratio)
      s += fmt::format(R"(<p class="lead"><b>headroom / PyTorch {} = {:.2f}</b> (above 1: headroom is faster).</p>)",
                       esc(str_of(p["headline"], "against")), *ratio);
  }
  s += R"(<table><thead><tr><th>Form</th><th>dtype</th><th>Attention</th><th>AdamW</th><th>Compiled</th>)"
       R"(<th class="num">Step (ms)</th><th class="num">Tokens/s</th><th class="num">headroom / this</th>)"
       R"(<th>Fell back</th></tr></thead><tbody>)";
  for (const json& f : forms) {
    const auto tps = num_of(f, {"tokens_per_s"});
    const auto step = num_of(f, {"median_step_s"});
    std::string fell;
    if (f.contains("fell_back") && f["fell_back"].is_array())
      for (const json& why : f["fell_back"]) fell += (fell.empty() ? "" : "; ") + why.get<std::string>();
    s += fmt::format(
        R"(<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td class="num">{}</td><td class="num">{}</td>)"
        R"(<td class="num">{}</td><td>{}</td></tr>)",
        esc(str_of(f, "form")), esc(str_of(f, "dtype")), esc(str_of(f, "attention")), esc(str_of(f, "optimizer")),
        f.value("compiled", false) ? "yes" : "no", step ? fmt::format("{:.2f}", *step * 1e3) : "-",
        tps ? fmt::format("{:.0f}", *tps) : "-",
        tps && headroom_tps > 0 && *tps > 0 ? fmt::format("{:.2f}", headroom_tps / *tps) : "-",
        fell.empty() ? "-" : esc(fell));
  }
  s += "</tbody></table></section>";
  return s;
}

}  // namespace hr::report::detail
