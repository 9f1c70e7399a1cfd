// run / validate / compare / report: the glue between the runner, results.json,
// the comparison and the HTML report, with the exit codes of the command line.
#include "harness/results/commands.hpp"

#include <fmt/format.h>
#include <fmt/ostream.h>

#include <filesystem>
#include <fstream>

#include "harness/check.hpp"
#include "harness/device.hpp"
#include "harness/dump/dump.hpp"
#include "harness/step/step_config.hpp"
#include "harness/results/results.hpp"
#include "harness/results/runner.hpp"
#include "reports/report.hpp"

namespace hr {

namespace {

namespace fs = std::filesystem;

std::unique_ptr<Device> open_device(const std::string& backend) {
  HR_ARG_CHECK(backend == "auto" || backend == "cpu" || backend == "cuda",
               "unknown backend '{}' (expected auto, cpu or cuda)", backend);
  try {
    return make_device(backend);
  } catch (const InvalidArgument&) {
    throw;
  } catch (const std::exception& e) {
    // A backend asked for by name that is not here is a problem with the request.
    throw InvalidArgument(fmt::format("--backend {}: {}", backend, e.what()));
  }
}

void make_dir(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  HR_ARG_CHECK(!ec, "cannot create the output directory {}: {}", dir, ec.message());
}

struct Written {
  std::string json, html;
};

// Runs the suite per c and writes results.json and index.html into c.out_dir.
// before_report is called with the run and its device while the device is open.
Written run_and_write(const RunCommand& c, std::ostream& err, Results& r, const report::ReportOptions& ropt,
                      const std::function<void(const Results&, Device&)>& before_report = {}) {
  RunOptions opt;
  opt.preset = parse_preset(c.preset);
  opt.only = c.only;
  opt.seed = c.seed;
  select_specs(opt);  // a bad --only is bad input before anything runs
  auto dev = open_device(c.backend);
  make_dir(c.out_dir);
  fmt::print(err, "headroom: running the {} preset on {} ({}){}\n", c.preset, dev->record().name,
             backend_name(dev->kind()), c.only.empty() ? "" : fmt::format(", only '{}'", c.only));
  r = run_suite(*dev, opt, &err);
  Written w{(fs::path(c.out_dir) / "results.json").string(), (fs::path(c.out_dir) / "index.html").string()};
  save_results(r, w.json);
  if (before_report) before_report(r, *dev);
  write_file_atomic(w.html, report::render_report(r, ropt));
  return w;
}

template <typename F>
int guarded(std::ostream& err, F&& f) {
  try {
    return f();
  } catch (const InvalidArgument& e) {
    fmt::print(err, "headroom: {}\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    fmt::print(err, "headroom: error: {}\n", e.what());
    return 2;
  }
}

}  // namespace

int command_run(const RunCommand& c, std::ostream& out, std::ostream& err) {
  return guarded(err, [&] {
    Results r;
    const Written w = run_and_write(c, err, r, {});
    const bool ok = r.totals.failed == 0;
    fmt::print(out,
               "headroom: {} of {} measurements passed, {} of {} negative controls caught ({} of {} subtle), "
               "{} sweep points{}\n",
               r.totals.passed, r.totals.measurements, r.totals.negative_controls_caught, r.totals.negative_controls,
               r.totals.subtle_controls_caught, r.totals.subtle_controls, r.totals.sweep_points,
               ok ? "" : fmt::format(" - {} FAILED", r.totals.failed));
    fmt::print(out, "headroom: results: {}\nheadroom: report:  {}\n", fs::absolute(w.json).string(),
               fs::absolute(w.html).string());
    return ok ? 0 : 1;
  });
}

int command_dump(const DumpCommand& c, std::ostream& out, std::ostream& err) {
  return guarded(err, [&] {
    StepConfig cfg = step_config_for(parse_model_kind(c.model), parse_preset(c.preset));
    nlohmann::json j = cfg;
    if (!c.config_file.empty()) {
      std::ifstream in(c.config_file);
      HR_ARG_CHECK(in.good(), "cannot open the step configuration {}", c.config_file);
      nlohmann::json patch;
      try {
        in >> patch;
      } catch (const nlohmann::json::exception& e) {
        throw InvalidArgument(fmt::format("{}: not valid JSON: {}", c.config_file, e.what()));
      }
      HR_ARG_CHECK(patch.is_object(), "{}: expected a JSON object of step configuration fields", c.config_file);
      j.merge_patch(patch);
    }
    if (!c.dtype.empty()) j["precision"]["compute"] = c.dtype;
    if (c.batch > 0) j["batch"] = c.batch;
    if (c.micro_batch > 0) j["micro_batch"] = c.micro_batch;
    try {
      cfg = step_config_from_json(j);
    } catch (const nlohmann::json::exception& e) {
      throw InvalidArgument(fmt::format("step configuration: {}", e.what()));
    }
    validate(cfg);  // a bad configuration is refused before anything is created
    auto dev = open_device(c.backend);
    make_dir(c.out_dir);
    const DumpResult r = dump_model(*dev, cfg, c.out_dir, c.data_seed);
    fmt::print(out, "headroom: dumped one {} step (loss {:.6g}, {} tensors) on {} into {}\n", c.model, r.loss,
               r.tensors, backend_name(dev->kind()), fs::absolute(c.out_dir).string());
    for (const auto& f : r.files) fmt::print(out, "  {}\n", f);
    return 0;
  });
}

int command_validate(const ValidateCommand& c, std::ostream& out, std::ostream& err) {
  return guarded(err, [&] {
    HR_ARG_CHECK(!c.baseline.empty(), "validate needs --baseline FILE");
    // The baseline is read first: a bad one is refused before anything runs.
    const Results base = load_results(c.baseline);
    Results cur;
    Comparison cmp;
    std::string html_path;
    if (!c.results.empty()) {
      cur = load_results(c.results);
      cmp = compare_results(base, cur, c.compare);
      if (!c.html.empty()) {
        report::ReportOptions ro{&base, &cmp, c.baseline};
        write_file_atomic(c.html, report::render_report(cur, ro));
        html_path = c.html;
      }
    } else {
      report::ReportOptions ro{&base, &cmp, c.baseline};
      const Written w = run_and_write(c.run, err, cur, ro, [&](const Results& r, Device& dev) {
        // A point judged slower is measured again by its sweep on this device
        // before it is called a regression.
        const Remeasure remeasure = [&](const SweepPoint& p) -> std::optional<SweepPoint> {
          for (const SweepSpec& spec : sweep_registry()) {
            if (spec.id != p.sweep || !spec.remeasure) continue;
            fmt::print(err, "headroom: re-measuring {} {} {} {} {}: judged slower than the baseline\n", p.sweep,
                       p.backend, p.dtype, p.model, config_label(p.config));
            RunContext ctx{dev, parse_preset(c.run.preset), c.run.seed, {}};
            dev.memory().reset_peak();
            return spec.remeasure(ctx, p);
          }
          return std::nullopt;
        };
        cmp = compare_results(base, r, c.compare, remeasure);
      });
      html_path = w.html;
      fmt::print(out, "headroom: results: {}\n", fs::absolute(w.json).string());
    }
    fmt::print(out, "{}", format_comparison_text(base, cur, cmp));
    if (!html_path.empty()) fmt::print(out, "headroom: report:  {}\n", fs::absolute(html_path).string());
    return cmp.fit() ? 0 : 1;
  });
}

int command_compare(const std::string& a, const std::string& b, const std::string& html, std::ostream& out,
                    std::ostream& err, const CompareOptions& opt) {
  return guarded(err, [&] {
    const Results base = load_results(a);
    const Results cur = load_results(b);
    const Comparison cmp = compare_results(base, cur, opt);
    fmt::print(out, "{}", format_comparison_text(base, cur, cmp));
    if (!html.empty()) {
      report::ReportOptions ro{&base, &cmp, a};
      write_file_atomic(html, report::render_report(cur, ro));
      fmt::print(out, "headroom: report:  {}\n", fs::absolute(html).string());
    }
    return cmp.fit() ? 0 : 1;
  });
}

int command_report(const std::string& results, const std::string& baseline, const std::string& html,
                   std::ostream& out, std::ostream& err) {
  return guarded(err, [&] {
    HR_ARG_CHECK(!html.empty(), "report needs --html OUT");
    const Results cur = load_results(results);
    if (baseline.empty()) {
      write_file_atomic(html, report::render_report(cur));
    } else {
      const Results base = load_results(baseline);
      const Comparison cmp = compare_results(base, cur);
      report::ReportOptions ro{&base, &cmp, baseline};
      write_file_atomic(html, report::render_report(cur, ro));
    }
    fmt::print(out, "headroom: report:  {}\n", fs::absolute(html).string());
    return 0;
  });
}

}  // namespace hr
