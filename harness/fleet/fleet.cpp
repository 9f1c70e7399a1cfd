// `headroom fleet`'s driver: launch, follow, judge, write (see fleet.hpp).
#include "harness/fleet/fleet.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <map>

#include "harness/check.hpp"
#include "harness/dist/launch.hpp"
#include "harness/fleet/fleet_internal.hpp"
#include "harness/output.hpp"
#include "harness/results/results.hpp"
#include "harness/results/runner.hpp"
#include "reports/fleet_report.hpp"

namespace hr::fleet {
namespace fs = std::filesystem;

namespace {

// The time the driver gives mpirun beyond a rank's budget: starting the ranks and
// their supervisors' last record.
constexpr double kLaunchMarginS = 60;

std::string self_exe() {
  std::error_code ec;
  const fs::path p = fs::read_symlink("/proc/self/exe", ec);
  return ec ? std::string() : p.string();
}

// A rank's record or work record, or null (absent or unreadable: still being written).
nlohmann::json read_record(const std::string& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) return nullptr;
  try {
    return read_json_file(path, "a rank's record", kMaxResultsBytes);
  } catch (const std::exception&) {
    return nullptr;
  }
}

// Whether a file name is a rank's marker: .<what>_<rank> (marker_path).
bool is_marker(const std::string& n) {
  const auto us = n.rfind('_');
  return n.size() > 2 && n[0] == '.' && us != std::string::npos && us > 1 && us + 1 < n.size() &&
         n.find_first_not_of("0123456789", us + 1) == std::string::npos;
}

// The folder's files of an earlier fleet (records, markers, logs) go before a new
// one starts: a record left from last time must not stand for a rank that died, nor
// a marker (a barrier passed, a decision taken) for one that has not yet come.
void clear_previous(const std::string& dir) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string n = e.path().filename().string();
    if (n.rfind("rank_", 0) == 0 || is_marker(n) || n == "fleet.json" || n == "fleet.html" || n == "mpirun.log")
      fs::remove(e.path(), ec);
  }
}

}  // namespace

int run_fleet(const FleetOptions& opt, std::ostream& out, std::ostream& err) {
  const Level& lv = level(opt.level);
  HR_ARG_CHECK(opt.ranks >= 1 && opt.ranks <= 4096, "fleet: --ranks is 1 to 4096, got {}", opt.ranks);
  std::string backend = opt.backend;
  if (backend == "auto") backend = cuda_device_available() ? "cuda" : "cpu";
  HR_ARG_CHECK(backend == "cpu" || backend == "cuda", "fleet: --backend is auto, cpu or cuda, got {}", opt.backend);
  BackendKind kind = backend == "cuda" ? BackendKind::cuda : BackendKind::cpu;
  nlohmann::json baseline;
  if (!opt.baseline.empty()) {
    baseline = read_json_file(opt.baseline, "the baseline fleet", kMaxResultsBytes);
    const std::string schema = baseline.value("schema", "");
    HR_ARG_CHECK(schema != "headroom.fleet/1",
                 "fleet: {} was written by an older headroom (headroom.fleet/1), whose throughputs were each device's "
                 "fastest round; this one judges the median of its rounds, which would read slower against it: run the "
                 "baseline fleet again with this build",
                 opt.baseline);
    HR_ARG_CHECK(schema == kFleetSchema, "fleet: {} is not a fleet file ({}), its schema is '{}'", opt.baseline,
                 kFleetSchema, schema);
  }
  const std::string exe = self_exe();
  if (exe.empty()) {
    err << "headroom fleet: cannot find this executable (/proc/self/exe)\n";
    return 2;
  }
  if (!opt.judge_only && dist::find_mpirun().empty()) {
    err << "headroom fleet: mpirun not found (install openmpi-bin, or set HEADROOM_MPIRUN)\n";
    return 2;
  }
  HR_ARG_CHECK(!opt.judge_only || fs::is_directory(opt.out), "fleet --judge: {} is not a folder of rank records",
               opt.out);
  fs::create_directories(opt.out);
  if (!opt.judge_only) clear_previous(opt.out);
  const std::string dir = fs::absolute(opt.out).string();
  HR_ARG_CHECK(opt.budget_s >= 0 && std::isfinite(opt.budget_s), "fleet: --budget must be a number of seconds >= 0");
  const double budget = opt.budget_s > 0 ? opt.budget_s : lv.budget_s(kind);
  if (opt.judge_only)
    out << fmt::format("headroom fleet: judging the records of {} ranks in {}\n", opt.ranks, dir);
  else
    out << fmt::format("headroom fleet: {} ranks on {}, level {} ({}); each device has {}\n", opt.ranks, backend,
                       opt.level, lv.what, format_duration(budget));

  // Follow the ranks: a line whenever one of them enters another phase, and one
  // every half minute that says where they all are.
  std::vector<std::string> seen(static_cast<size_t>(opt.ranks));
  const auto t0 = std::chrono::steady_clock::now();
  auto last_poll = t0, last_line = t0;
  auto tick = [&] {
    const auto now = std::chrono::steady_clock::now();
    if (now - last_poll < std::chrono::seconds(1)) return;
    last_poll = now;
    const std::string at = format_duration(std::chrono::duration<double>(now - t0).count());
    for (int r = 0; r < opt.ranks; ++r) {
      nlohmann::json w = read_record(rank_file(dir, r));
      if (w.is_null()) w = read_record(work_file(dir, r));
      if (w.is_null()) continue;
      std::string phase = w.value("phase", "");
      if (w.contains("status")) phase = w["status"] == "ok" ? "done" : "failed (" + phase + ")";
      if (phase == seen[static_cast<size_t>(r)]) continue;
      seen[static_cast<size_t>(r)] = phase;
      out << fmt::format("headroom fleet: rank {}: {} ({})\n", r, phase, at) << std::flush;
      last_line = now;
    }
    if (now - last_line >= std::chrono::seconds(30)) {
      std::map<std::string, int> where;
      for (const std::string& p : seen) ++where[p.empty() ? "starting" : p];
      std::string line;
      for (const auto& [p, n] : where) line += fmt::format("{}{} {}", line.empty() ? "" : ", ", n, p);
      out << fmt::format("headroom fleet: {}: ranks at {}\n", at, line) << std::flush;
      last_line = now;
    }
  };
  const std::string log = (fs::path(dir) / "mpirun.log").string();
  const std::vector<std::string> args{"fleet-rank", "--dir", dir, "--level", std::to_string(opt.level), "--seed",
                                      std::to_string(opt.seed), "--backend", backend, "--budget", fmt::format("{}", budget)};
  dist::MpirunRun m;
  if (opt.judge_only) {
    m.command = "(the ranks were started elsewhere; judged with --judge)";
  } else {
    m = dist::launch_mpirun(opt.ranks, exe, args, budget + kLaunchMarginS, log, tick);
    if (!m.error.empty()) {
      err << "headroom fleet: " << m.error << "\n";
      return 2;
    }
    tick();
  }

  std::vector<nlohmann::json> records;
  for (int r = 0; r < opt.ranks; ++r) {
    nlohmann::json rec = read_record(rank_file(dir, r));
    if (rec.is_null()) {
      // A supervisor that died too left at most its child's work record.
      rec = read_record(work_file(dir, r));
      if (rec.is_object()) {
        rec["status"] = "failed";
        rec["failure"] = {{"phase", rec.value("phase", "?")},
                          {"reason", m.timed_out ? "mpirun was stopped at the fleet's time limit"
                                                 : "the rank's supervisor ended without its record"}};
      }
    }
    records.push_back(std::move(rec));
  }
  // Judged elsewhere (a login node without a GPU), the records say what ran: their
  // backend sets the floor, their level is the fleet's.
  int level_ran = opt.level;
  if (opt.judge_only)
    for (const nlohmann::json& r : records)
      if (r.is_object() && r.contains("backend") && r.contains("level")) {
        backend = r["backend"].get<std::string>();
        kind = backend == "cuda" ? BackendKind::cuda : BackendKind::cpu;
        level_ran = r["level"].get<int>();
        break;
      }
  if (!opt.judge_only &&
      std::none_of(records.begin(), records.end(), [](const nlohmann::json& r) { return r.is_object(); }))
    err << "headroom fleet: no rank wrote a record; mpirun exited with " << m.exit_code << ", its log ends:\n"
        << dist::log_tail(log, 3000) << "\n";
  nlohmann::json fleet = judge_fleet(records, baseline, kind);
  fleet["level"] = level_ran;
  fleet["level_what"] = level(level_ran).what;
  fleet["backend"] = backend;
  fleet["seed"] = opt.seed;
  fleet["ranks"] = opt.ranks;
  fleet["budget_s_per_device"] = budget;
  if (!opt.judge_only) fleet["seconds"] = m.seconds;
  fleet["run_time_utc"] = utc_now_iso8601();
  fleet["mpirun"] = {{"command", m.command}, {"exit_code", m.exit_code}, {"timed_out", m.timed_out}, {"log", "mpirun.log"}};
  fleet["build"] = build_record();
  if (!baseline.is_null()) fleet["baseline"] = opt.baseline;

  // Level 3: the fleet's own all-reduce over every device, once each of them passed.
  if (lv.all_reduce && !opt.judge_only) {
    if (fleet["verdict"] != "pass") {
      fleet["all_reduce"] = {{"status", "not run"}, {"reason", "a device is not ok"}};
    } else {
      out << "headroom fleet: the all-reduce across the fleet\n";
      const dist::WorkerRun w = dist::run_dp_worker(
          opt.ranks,
          {"bench", "--preset", preset_name(lv.preset), "--seed", std::to_string(opt.seed), "--backend", backend, "--engine",
           kind == BackendKind::cuda ? "nccl" : "mpi"},
          budget);
      if (w.ok) {
        fleet["all_reduce"] = {{"status", "ok"}, {"points", w.output.value("sweep_points", nlohmann::json::array())}};
      } else {
        fleet["all_reduce"] = {{"status", "error"}, {"reason", w.error}};
        fleet["verdict"] = "fail";
      }
    }
  }

  write_output((fs::path(dir) / "fleet.json").string(), fleet.dump(1) + "\n");
  write_output((fs::path(dir) / "fleet.html").string(), report::render_fleet_report(fleet));
  if (!opt.junit.empty()) write_output(opt.junit, fleet_junit(fleet));

  for (const auto& d : fleet["devices"]) {
    std::string line = fmt::format("headroom fleet: rank {:<3} {:<7} {}", d.value("rank", 0), d.value("verdict", ""),
                                   d.value("device_name", d.value("host", "")));
    const auto& reasons = d.value("reasons", nlohmann::json::array());
    if (!reasons.empty()) line += ": " + reasons[0].get<std::string>();
    if (reasons.size() > 1) line += fmt::format(" (+{} more)", reasons.size() - 1);
    out << line << "\n";
  }
  const auto& s = fleet["summary"];
  out << fmt::format("headroom fleet: {} of {} devices ok ({} slow, {} wrong, {} failed) in {}; verdict {}\n",
                     s.value("ok", 0), s.value("devices", 0), s.value("slow", 0), s.value("wrong", 0),
                     s.value("failed", 0), format_duration(m.seconds), fleet["verdict"] == "pass" ? "PASS" : "FAIL");
  out << "headroom fleet: results: " << (fs::path(dir) / "fleet.json").string() << "\n"
      << "headroom fleet: report:  " << (fs::path(dir) / "fleet.html").string() << "\n";
  return fleet["verdict"] == "pass" ? 0 : 1;
}

}  // namespace hr::fleet
