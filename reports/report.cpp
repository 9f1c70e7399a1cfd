// The HTML report, assembled from its sections (reports/section_*.cpp, on the
// shared toolkit of reports/parts.hpp): summary, device and build, conformance
// matrix, memory by consumer, curves, trade table, data parallel, the PyTorch
// peer, baseline verdict, run record. Each section reads the Results (the peer
// section its own record); a section without data says so.
#include "reports/report.hpp"

#include <fmt/format.h>

#include "reports/html.hpp"
#include "reports/parts.hpp"

namespace hr::report {

using namespace detail;

std::string render_report(const Results& r, const ReportOptions& opt) {
  std::string h;
  h.reserve(1 << 16);
  const std::string dev_name = str_of(r.device, "name");
  h += "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
       "<meta name=\"viewport\" content=\"width=device-width,initial-scale=1\">";
  h += fmt::format("<title>headroom report: {}</title>", esc(dev_name));
  h += "<style>";
  h += kCss;
  h += "</style></head><body>";
  h += fmt::format(R"(<header class="top"><div class="wrap"><div><h1>headroom<small>memory-saving training techniques: conformance and cost</small></h1>)"
                   R"(<div class="sub">{} &middot; {} &middot; {} preset &middot; {}</div></div>)"
                   R"(<div class="sub">headroom {} &middot; {}</div></div></header>)",
                   esc(dev_name), esc(r.backend), esc(r.preset), esc(r.run_time_utc), esc(str_of(r.build, "version")),
                   esc(str_of(r.build, "git_sha")));
  h += R"(<nav class="toc"><div class="wrap">)";
  for (const auto& [id, name] : std::initializer_list<std::pair<const char*, const char*>>{
           {"summary", "Summary"}, {"conformance", "Conformance"}, {"memory", "Memory"},
           {"curve-bm-mb", "Micro-batch"}, {"curve-ck-3", "Depth"}, {"curve-seq", "Sequence"},
           {"curve-q8-3", "8-bit state"}, {"curve-mp", "Mixed precision"}, {"trade", "Trade"}, {"dp", "Data parallel"}, {"peer", "PyTorch"},
           {"baseline", "Baseline"}, {"device", "Device"}, {"run", "Run"}})
    h += fmt::format(R"(<a href="#{}">{}</a>)", id, name);
  h += R"(</div></nav><main class="wrap">)";
  // The first screen: the summary and the conformance matrix; the device and build
  // (named in the header) come with the run record at the end.
  h += summary(r, opt);
  h += conformance_section(r);
  h += memory_section(r);
  h += curve_bm_mb(r);
  h += curve_ck3(r);
  h += curve_seq(r);
  h += curve_q83(r);
  h += curve_mp(r);
  h += trade_section(r);
  h += dp_section(r);
  h += peer_section(opt);
  h += baseline_section(r, opt);
  h += device_section(r);
  h += run_section(r);
  h += fmt::format(R"(</main><footer>headroom.results/1 &middot; generated from results.json &middot; this page needs )"
                   R"(no network and no scripts</footer></body></html>)");
  h += "\n";
  return h;
}

}  // namespace hr::report
