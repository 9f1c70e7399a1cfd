// The curve sections: micro-batch, depth, sequence length, 8-bit state and mixed
// precision (MP-1's histogram, MP-3's scale trajectory).
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

// ---- Curves -------------------------------------------------------------------------------

std::string curve_bm_mb(const Results& r) {
  std::string s = section_open("curve-bm-mb", "Micro-batch size (BM-MB)",
                               "At a fixed effective batch, smaller micro-batches hold fewer activations but keep "
                               "the device less busy: throughput and peak bytes against the micro-batch size.");
  const auto pts = points_of(r, {"BM-MB"});
  if (pts.empty()) return s + not_measured("no BM-MB sweep points") + "</section>";
  std::string unit = "steps/s";
  for (const auto* p : pts) {
    if (p->metrics.contains("tokens_per_s")) { unit = "tokens/s"; break; }
    if (p->metrics.contains("samples_per_s")) unit = "samples/s";
  }
  auto thr = [&](const SweepPoint& p) -> std::optional<double> {
    if (unit == "tokens/s") return num_of(p.metrics, {"tokens_per_s"});
    if (unit == "samples/s") return num_of(p.metrics, {"samples_per_s"});
    if (p.time && p.time->median_s > 0) return 1.0 / p.time->median_s;
    return std::nullopt;
  };
  const std::set<std::string> ignore = {"accum_steps"};
  auto t_series = make_series(pts, {"micro_batch"}, ignore, thr);
  auto m_series = make_series(pts, {"micro_batch"}, ignore, [](const SweepPoint& p) -> std::optional<double> {
    return p.memory.total_peak_bytes > 0 ? std::optional<double>(static_cast<double>(p.memory.total_peak_bytes))
                                         : std::nullopt;
  });
  ChartOptions a;
  a.title = "Throughput";
  a.x_label = "micro-batch size";
  a.y_label = unit;
  a.log_x = true;
  ChartOptions b = a;
  b.title = "Peak bytes (all consumers)";
  b.y_label = "peak bytes";
  b.y_format = AxisFormat::bytes;
  s += R"(<div class="charts">)" + line_chart(t_series, a) + line_chart(m_series, b) + "</div>";

  // Per-sample throughput relative to the largest micro-batch of the same series.
  s += R"(<details><summary>Table: throughput relative to the largest micro-batch</summary><table><thead><tr>)"
       R"(<th>Series</th><th class="num">Micro-batch</th><th class="num">Step time</th><th class="num">)" +
       esc(unit) + R"(</th><th class="num">Relative</th><th class="num">Peak bytes</th>)"
       R"(<th class="num">Host waits per step</th></tr></thead><tbody>)";
  for (const auto& ser : t_series) {
    if (ser.points.empty()) continue;
    auto best = *std::max_element(ser.points.begin(), ser.points.end());
    for (auto [x, y] : ser.points) {
      const SweepPoint* pp = nullptr;
      for (const auto* p : pts) {
        auto px = num_of(p->config, {"micro_batch"});
        auto py = thr(*p);
        if (px && *px == x && py && *py == y) pp = p;
      }
      const std::optional<double> waits = pp ? num_of(pp->metrics, {"host_syncs_per_step"}) : std::nullopt;
      s += fmt::format(R"(<tr><td>{}</td><td class="num">{}</td><td class="num">{}</td><td class="num">{}</td><td class="num">{:.2f}</td><td class="num">{}</td><td class="num">{}</td></tr>)",
                       esc(ser.name), esc(fmt_num(x)), esc(pp && pp->time ? fmt_seconds(pp->time->median_s) : "-"),
                       esc(fmt_si(y)), best.second > 0 ? y / best.second : 0.0,
                       esc(pp ? fmt_bytes_short(static_cast<double>(pp->memory.total_peak_bytes)) : "-"),
                       esc(waits ? fmt_num(*waits) : "-"));
    }
  }
  s += "</tbody></table></details>";
  s += op_time_tables(pts);
  s += "</section>";
  return s;
}

// Where a step's time goes (HEADROOM_OP_PROFILE, harness/op_profile.hpp): for each
// profiled point, its ops by device time in the profiled run, the largest first,
// against the timed step (the median, or the ops' sum where the profile's events made
// that larger). Nothing where no point was profiled.
std::string op_time_tables(const std::vector<const SweepPoint*>& pts) {
  std::vector<const SweepPoint*> profiled;
  std::set<std::string> keys;
  for (const auto* p : pts)
    if (p->time && !p->time->op_seconds.empty()) {
      profiled.push_back(p);
      for (auto it = p->config.begin(); it != p->config.end(); ++it) keys.insert(it.key());
    }
  if (profiled.empty()) return "";
  // The config keys that tell the profiled points apart.
  std::set<std::string> varying;
  for (const std::string& k : keys) {
    std::set<std::string> values;
    for (const auto* p : profiled) values.insert(p->config.contains(k) ? p->config[k].dump() : "");
    if (values.size() > 1) varying.insert(k);
  }
  constexpr size_t kShown = 12;
  std::string s = R"(<details><summary>Table: device time by op (HEADROOM_OP_PROFILE))"
                  R"(</summary><table><thead><tr><th>Point</th><th>Op</th><th class="num">Per step</th>)"
                  R"(<th class="num">Share</th></tr></thead><tbody>)";
  for (const auto* p : profiled) {
    std::vector<std::pair<double, std::string>> ops;
    double sum = 0;
    for (const auto& [op, sec] : p->time->op_seconds) {
      ops.emplace_back(sec, op);
      sum += sec;
    }
    std::sort(ops.rbegin(), ops.rend());
    const double step = std::max(p->time->median_s, sum);
    const std::string label = short_config_label(p->config, varying, true);
    auto row = [&](const std::string& op, double sec) {
      s += fmt::format(R"(<tr><td>{}</td><td>{}</td><td class="num">{}</td><td class="num">{:.1f}%</td></tr>)",
                       esc(label), esc(op), esc(fmt_seconds(sec)), step > 0 ? 100.0 * sec / step : 0.0);
    };
    double rest = 0;
    for (size_t i = 0; i < ops.size(); ++i) {
      if (i < kShown) row(ops[i].second, ops[i].first);
      else rest += ops[i].first;
    }
    if (ops.size() > kShown) row(fmt::format("{} other ops", ops.size() - kShown), rest);
    if (step > sum) row("outside any op", step - sum);
  }
  return s + "</tbody></table></details>";
}

// An activation peak's chart against `x_label`, on log-log axes (its exponents read
// as slopes).
static ChartOptions activation_peak_chart(const char* x_label) {
  ChartOptions o;
  o.title = "Peak activation bytes";
  o.x_label = x_label;
  o.y_label = "activation peak";
  o.log_x = o.log_y = true;
  o.y_format = AxisFormat::bytes;
  return o;
}

std::string curve_ck3(const Results& r) {
  std::string s = section_open("curve-ck-3", "Activation peak against depth (CK-3)",
                               "Without checkpointing the activations kept grow linearly with depth (exponent ~1); "
                               "with sqrt(L) segments they grow like sqrt(L) (exponent &le; 0.65, Chen et al. 2016). "
                               "Exponents are least-squares fits on log-log axes.");
  const auto pts = points_of(r, {"CK-3"});
  const auto bm = points_of(r, {"BM-CK"});
  if (pts.empty() && bm.empty()) return s + not_measured("no CK-3 or BM-CK sweep points") + "</section>";
  // The curves need CK-3; BM-CK's table below stands without it.
  if (pts.empty()) {
    s += not_measured("no CK-3 sweep points");
  } else {
    auto series = make_series(pts, {"depth", "layers", "n_layers"}, {}, activation_peak);
    add_exponents(series);
    ChartOptions o = activation_peak_chart("depth (blocks)");
    // Everything the pass allocated, workspace included (CK-3's pass peak): a saving
    // that only charged kept tensors to another consumer would not show here.
    auto pass = make_series(pts, {"depth", "layers", "n_layers"}, {}, [](const SweepPoint& p) {
      return num_of(p.metrics, {"pass_peak_bytes"});
    });
    add_exponents(pass);
    std::string charts = line_chart(series, o);
    if (!pass.empty()) {
      ChartOptions t = o;
      t.title = "Peak bytes of the pass (workspace included)";
      t.y_label = "pass peak";
      charts += line_chart(pass, t);
    }
    s += R"(<div class="charts">)" + charts + "</div>";
  }

  // BM-CK: what each granularity costs in step time, beside what it saves.
  if (bm.empty()) {
    s += "<p>Step time per granularity: BM-CK was not run.</p>";
  } else {
    s += R"(<table><thead><tr><th>Granularity</th><th class="num">Segment (blocks)</th><th class="num">Step time</th>)"
         R"(<th class="num">Overhead</th><th class="num">Activation peak</th><th class="num">Total peak</th>)"
         R"(</tr></thead><tbody>)";
    for (const auto* p : bm) {
      const auto ratio = num_of(p->metrics, {"overhead_ratio"});
      const auto act = num_of(p->metrics, {"activation_peak_bytes"});
      s += fmt::format(
          R"(<tr><td>{}</td><td class="num">{}</td><td class="num">{}</td><td class="num">{}</td><td class="num">{}</td><td class="num">{}</td></tr>)",
          esc(str_of(p->config, "checkpoint") + " (" + p->backend + " " + p->dtype + ")"),
          esc(fmt_num(num_of(p->config, {"every_k_blocks"}).value_or(0))),
          esc(p->time ? fmt_seconds(p->time->median_s) : "-"),
          esc(ratio ? fmt::format("{:+.0f}%", (*ratio - 1) * 100) : "-"),
          esc(act ? fmt_bytes_short(*act) : "-"), esc(fmt_bytes_short(static_cast<double>(p->memory.total_peak_bytes))));
    }
    s += "</tbody></table><p>Overhead: step time against no checkpointing on this device (Chen et al. 2016: ~30% "
         "for one extra forward; the field guide: 30-40%).</p>";
  }
  return s + "</section>";
}

std::string curve_seq(const Results& r) {
  std::string s = section_open("curve-seq", "Activation peak against sequence length (PK-4, BM-SEQ)",
                               "Naive attention materialises the T&times;T scores (exponent ~2); memory-efficient "
                               "attention keeps O(T) (exponent ~1; Rabe &amp; Staats 2021). Below: pad tokens per "
                               "batching strategy (PK-3) and what packing buys in useful tokens/s (BM-PK).");
  const auto pts = points_of(r, {"PK-4", "BM-SEQ"});
  // The curves need PK-4 or BM-SEQ; the tables below stand without them (a run of
  // BM-PK alone).
  if (pts.empty()) {
    s += not_measured("no PK-4 or BM-SEQ sweep points");
  } else {
    auto series = make_series(pts, {"seq_len", "seq", "T"}, {}, activation_peak);
    add_exponents(series);
    ChartOptions o = activation_peak_chart("sequence length (tokens)");
    std::string charts = line_chart(series, o);
    auto t_series = make_series(points_of(r, {"BM-SEQ"}), {"seq_len", "seq", "T"}, {},
                                [](const SweepPoint& p) -> std::optional<double> {
                                  if (p.time && p.time->median_s > 0) return p.time->median_s;
                                  return std::nullopt;
                                });
    if (!t_series.empty()) {
      ChartOptions t = o;
      t.title = "Step time";
      t.y_label = "step time";
      t.y_format = AxisFormat::seconds;
      charts += line_chart(t_series, t);
    }
    s += R"(<div class="charts">)" + charts + "</div>";
  }

  // PK-3: the fraction of pad tokens per strategy and length distribution (the
  // check's details), one table per backend run.
  for (const Measurement& m : r.measurements) {
    if (m.id != "PK-3" || m.negative_control || !m.details.contains("pad_fraction")) continue;
    const auto& pf = m.details["pad_fraction"];
    if (!pf.is_object()) continue;
    s += fmt::format(R"(<h3>Pad tokens per strategy (PK-3, rows of {} tokens, batches of {})</h3>)",
                     esc(fmt_num(num_of(m.config, {"seq_len"}).value_or(0))),
                     esc(fmt_num(num_of(m.config, {"batch_rows"}).value_or(0))));
    s += R"(<table><thead><tr><th>Lengths</th><th class="num">Mean length</th><th class="num">Pad to max</th>)"
         R"(<th class="num">Pad to longest</th><th class="num">Bucketed</th><th class="num">Packed</th></tr></thead><tbody>)";
    for (const auto& [dist, v] : pf.items()) {
      auto pct = [&](const char* k) {
        const auto x = num_of(v, {k});
        return x ? fmt::format("{:.1f}%", *x * 100) : std::string("-");
      };
      s += fmt::format(
          R"(<tr><td>{}</td><td class="num">{}</td><td class="num">{}</td><td class="num">{}</td><td class="num">{}</td><td class="num">{}</td></tr>)",
          esc(dist), esc(fmt::format("{:.0f}", num_of(v, {"mean_length"}).value_or(0))), esc(pct("pad_to_max")),
          esc(pct("pad_to_longest")), esc(pct("bucketed")), esc(pct("packed")));
    }
    s += "</tbody></table><p>Anchor: Krell et al. 2021, up to 50% padding on Wikipedia at 512; first-fit-decreasing "
         "packing removes nearly all of it.</p>";
    break;
  }

  // BM-PK: useful (non-pad) tokens/s per strategy on the long tail.
  const auto bm = points_of(r, {"BM-PK"});
  if (!bm.empty()) {
    // The attention kernels each strategy timed: a packed batch's segment mask is not
    // one every form takes (cuDNN's falls back to the scalar kernels), and a speed
    // compared across kernels says so here.
    s += R"(<h3>Useful tokens per second (BM-PK)</h3><table><thead><tr><th>Strategy</th><th class="num">Pad tokens</th>)"
         R"(<th class="num">Useful tokens/s</th><th class="num">Against pad-to-max</th><th class="num">Activation peak</th>)"
         R"(<th>Attention kernels</th></tr></thead><tbody>)";
    for (const auto* p : bm) {
      const auto pad = num_of(p->metrics, {"pad_fraction"});
      const auto tps = num_of(p->metrics, {"useful_tokens_per_s"});
      const auto rel = num_of(p->metrics, {"useful_throughput_vs_pad_to_max"});
      const auto act = num_of(p->metrics, {"activation_peak_bytes"});
      // With why it is not the form asked for, where it is not.
      std::string kernels = attention_kernels_label(*p);
      if (const std::string fell = attention_fallbacks_label(*p); !kernels.empty() && !fell.empty())
        kernels += " (" + fell + ")";
      s += fmt::format(
          R"(<tr><td>{}</td><td class="num">{}</td><td class="num">{}</td><td class="num">{}</td><td class="num">{}</td>)"
          R"(<td>{}</td></tr>)",
          esc(str_of(p->config, "strategy") + " (" + p->backend + " " + p->dtype + ")"),
          esc(pad ? fmt::format("{:.1f}%", *pad * 100) : "-"), esc(tps ? fmt::format("{:.0f}", *tps) : "-"),
          esc(rel ? fmt::format("{:.2f}x", *rel) : "-"), esc(act ? fmt_bytes_short(*act) : "-"),
          esc(kernels.empty() ? std::string("-") : kernels));
    }
    s += "</tbody></table>";
  }
  s += "</section>";
  return s;
}

std::string curve_q83(const Results& r) {
  std::string s = section_open("curve-q8-3", "8-bit against fp32 optimizer state (Q8-3)",
                               "Long horizon without resynchronising: the loss of 8-bit Adam against fp32 Adam on "
                               "the same problem. The drift is what accumulates from quantising the moments.");
  std::vector<Series> series;
  const auto pts = points_of(r, {"Q8-3"});
  if (!pts.empty())
    series = make_series(pts, {"step"}, {}, [](const SweepPoint& p) { return num_of(p.metrics, {"loss"}); });
  std::string x_label = "step", y_label = "loss";
  if (series.empty()) {
    for (const auto& m : r.measurements) {
      if (m.id != "Q8-3" || !m.details.contains("curve")) continue;
      const auto& c = m.details["curve"];
      if (!c.is_object() || !c.contains("x") || !c.contains("series") || !c["x"].is_array() || !c["series"].is_object())
        continue;
      x_label = str_of(c, "x_label").empty() ? x_label : str_of(c, "x_label");
      y_label = str_of(c, "y_label").empty() ? y_label : str_of(c, "y_label");
      for (auto it = c["series"].begin(); it != c["series"].end(); ++it) {
        Series ser{it.key(), {}, "", false};
        if (!it->is_array()) continue;
        for (size_t i = 0; i < it->size() && i < c["x"].size(); ++i) {
          try {
            ser.points.emplace_back(json_to_double(c["x"][i]), json_to_double((*it)[i]));
          } catch (...) {
          }
        }
        series.push_back(std::move(ser));
      }
      break;
    }
  }
  if (series.empty()) return s + not_measured("no Q8-3 drift curve") + "</section>";
  ChartOptions o;
  o.title = "Loss over steps";
  o.x_label = x_label;
  o.y_label = y_label;
  std::string charts = line_chart(series, o);
  // The drift: each other series relative to the first (the fp32 reference when
  // the sweep lists it first), at the steps both have.
  if (series.size() >= 2) {
    std::map<double, double> ref(series[0].points.begin(), series[0].points.end());
    std::vector<Series> drift;
    for (size_t i = 1; i < series.size(); ++i) {
      Series d{series[i].name + " vs " + series[0].name, {}, palette()[i % palette().size()], false};
      for (const auto& [x, y] : series[i].points) {
        auto it = ref.find(x);
        if (it != ref.end() && it->second != 0) d.points.emplace_back(x, (y / it->second - 1.0) * 100.0);
      }
      drift.push_back(std::move(d));
    }
    ChartOptions dopt = o;
    dopt.title = "Drift (relative difference of " + y_label + ", %)";
    dopt.y_label = "% difference";
    charts += line_chart(drift, dopt);
  }
  s += R"(<div class="charts">)" + charts + "</div>";
  for (const auto& m : r.measurements)
    if (m.id == "Q8-3" && m.metric != "exception")
      s += fmt::format(R"(<p>Final-loss difference: {} {} (tolerance {}) {}</p>)", esc(m.metric), esc(fmt_num(m.error)),
                       esc(fmt_num(m.tolerance)), status_badge(m));
  return s + "</section>";
}

// ---- Mixed precision (MP-1, MP-3) ----------------------------------------------------------

// The first measurement of `id` whose details hold `key`.
const Measurement* measurement_with(const Results& r, const std::string& id, const char* key) {
  for (const auto& m : r.measurements)
    if (m.id == id && m.details.is_object() && m.details.contains(key) && !m.negative_control) return &m;
  return nullptr;
}

// MP-1's exponent histogram of the fp32 gradients, unscaled and shifted by the loss
// scale, with fp16's smallest subnormal (2^-24) and smallest normal (2^-14).
std::string mp_histogram_chart(const Measurement& m) {
  const json& h = m.details["exponent_histogram"];
  if (!h.is_object() || h.empty()) return not_measured("an empty MP-1 exponent histogram");
  const double scale = num_of(m.details, {"loss_scale"}).value_or(1.0);
  const int shift = scale > 0 ? static_cast<int>(std::lround(std::log2(scale))) : 0;
  Series plain{"fp32 gradients (count per exponent)", {}, palette()[0], false};
  Series scaled{fmt::format("scaled by 2^{}", shift), {}, palette()[1], true};
  double top = 0;
  std::map<int, double> bins;
  for (auto it = h.begin(); it != h.end(); ++it) {
    try {
      bins[std::stoi(it.key())] = json_to_double(*it);
    } catch (...) {
    }
  }
  for (const auto& [e, n] : bins) {
    plain.points.emplace_back(e, n);
    scaled.points.emplace_back(e + shift, n);
    top = std::max(top, n);
  }
  Series sub{"2^-24: fp16's smallest subnormal (under 2^-25 flushes)", {{-24, 0}, {-24, top}}, "#dc2626", true};
  Series nrm{"2^-14: fp16's smallest normal", {{-14, 0}, {-14, top}}, "#6b7280", true};
  ChartOptions o;
  o.title = "Exponents of the fp32 weight gradients (MP-1)";
  o.x_label = "binary exponent e (|g| in [2^e, 2^(e+1)))";
  o.y_label = "values";
  o.width = 760;
  return line_chart({plain, scaled, sub, nrm}, o);
}

// MP-3's scale trajectory: the scale each step ran at, GradScaler's rule beside it,
// and the skipped steps.
std::string mp_trajectory_chart(const Measurement& m) {
  const json& t = m.details["trajectory"];
  if (!t.is_object() || !t.contains("scale") || !t["scale"].is_array()) return not_measured("no MP-3 trajectory");
  Series got{"loss scale (measured)", {}, palette()[0], false};
  Series want{"GradScaler's rule", {}, palette()[2], true};
  std::vector<std::string> skipped;
  for (size_t i = 0; i < t["scale"].size(); ++i) {
    try {
      got.points.emplace_back(static_cast<double>(i), json_to_double(t["scale"][i]));
      if (t.contains("expected_scale") && i < t["expected_scale"].size())
        want.points.emplace_back(static_cast<double>(i), json_to_double(t["expected_scale"][i]));
      if (t.contains("skipped") && i < t["skipped"].size() && t["skipped"][i].is_boolean() &&
          t["skipped"][i].get<bool>())
        skipped.push_back(std::to_string(i));
    } catch (...) {
    }
  }
  ChartOptions o;
  o.title = fmt::format("Loss scale per step (growth interval {})",
                        esc(fmt_num(num_of(t, {"growth_interval"}).value_or(NAN))));
  o.x_label = "step";
  o.y_label = "loss scale";
  o.log_y = true;
  std::string out = line_chart({got, want}, o);
  std::string list;
  for (const auto& k : skipped) list += (list.empty() ? "" : ", ") + k;
  out += fmt::format("<p>Skipped steps (an overflowing micro-batch): {}.</p>", esc(list.empty() ? "none" : list));
  return out;
}

std::string curve_mp(const Results& r) {
  std::string s = section_open(
      "curve-mp", "Mixed precision: fp16 underflow and the loss scale (MP-1, MP-3)",
      "Where the fp32 gradients' exponents lie against fp16's range, without and with the loss scale "
      "(Micikevicius et al. 2018: ~5% of weight gradients under 2^-24), and the dynamic scaler's trajectory: "
      "back off by 0.5 at an overflow, grow by 2 after the growth interval of clean steps.");
  const Measurement* h = measurement_with(r, "MP-1", "exponent_histogram");
  const Measurement* t = measurement_with(r, "MP-3", "trajectory");
  if (!h && !t) return s + not_measured("no MP-1 histogram or MP-3 trajectory") + "</section>";
  std::string charts;
  charts += h ? mp_histogram_chart(*h) : not_measured("no MP-1 exponent histogram");
  charts += t ? mp_trajectory_chart(*t) : not_measured("no MP-3 scale trajectory");
  s += R"(<div class="charts">)" + charts + "</div>";
  if (h) {
    const json& d = h->details;
    s += fmt::format(
        "<p>Of {} non-zero fp32 gradient values, {} lie under 2^-24 and {} flush to zero in fp16 unscaled; "
        "scaled by {} {} flush.</p>",
        esc(fmt_num(num_of(d, {"nonzero_values"}).value_or(NAN))),
        esc(fmt_num(100 * num_of(d, {"fraction_below_2^-24"}).value_or(NAN)) + "%"),
        esc(fmt_num(100 * num_of(d, {"flushed_fraction_unscaled"}).value_or(NAN)) + "%"),
        esc(fmt_num(num_of(d, {"loss_scale"}).value_or(NAN))),
        esc(fmt_num(100 * num_of(d, {"flushed_fraction_scaled"}).value_or(NAN)) + "%"));
  }
  return s + "</section>";
}

}  // namespace hr::report::detail
