// One rank of `headroom fleet` (see fleet.hpp): its place in the launch, its
// supervisor, and the level's work on its device.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <algorithm>
#include <map>
#include <numeric>
#include <random>
#include <thread>

#include "harness/check.hpp"
#include "harness/data/synthetic.hpp"
#include "harness/dist/launch.hpp"
#include "harness/fleet/digest.hpp"
#include "harness/fleet/fleet.hpp"
#include "harness/fleet/fleet_internal.hpp"
#include "harness/output.hpp"
#include "harness/properties/microbatch_sweep.hpp"
#include "harness/properties/sweep_support.hpp"
#include "harness/results/results.hpp"
#include "harness/results/runner.hpp"
#include "harness/step/train_step.hpp"
#include "harness/tensor.hpp"
#include "harness/text.hpp"
#include "kernels/common/op_fault.hpp"
#include "kernels/matmul/matmul.hpp"

namespace hr::fleet {
namespace fs = std::filesystem;

const Level& level(int number) {
  // Entries that launch mpirun themselves stay out of a rank (no launch inside a
  // launch); the fleet's own all-reduce is level 3's last part.
  static const std::string kNoLaunch = "^(DP-1|DP-MEM|BM-DP)$";
  static const Level kLevels[] = {
      {1, "op conformance, the step digest twice, throughput", Preset::quick, "^(OPS-1|OPS-3)$", "", 300, 120,
       false},
      {2, "level 1 and the quick preset", Preset::quick, "", kNoLaunch, 1200, 600, false},
      {3, "the full preset, then the fleet's all-reduce", Preset::full, "", kNoLaunch, 14400, 1800, true},
  };
  HR_ARG_CHECK(number >= 1 && number <= 3, "fleet: --level is 1, 2 or 3, got {}", number);
  return kLevels[number - 1];
}

namespace {

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  return end != v && *end == '\0' && x >= 0 && x < (1 << 24) ? static_cast<int>(x) : fallback;
}

}  // namespace

RankPlace rank_place() {
  RankPlace p;
  struct Source {
    const char *rank, *size, *local, *name;
  };
  const Source sources[] = {{"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "Open MPI"},
                            {"PMIX_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "PMIx"},
                            {"PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "PMI (Hydra)"},
                            {"SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "Slurm"}};
  for (const Source& s : sources) {
    const int r = env_int(s.rank, -1);
    if (r < 0) continue;
    p.rank = r;
    p.size = std::max(env_int(s.size, r + 1), r + 1);
    p.local_rank = env_int(s.local, r);
    p.launcher = s.name;
    return p;
  }
  return p;
}

std::string rank_file(const std::string& dir, int rank) { return (fs::path(dir) / fmt::format("rank_{}.json", rank)).string(); }
std::string work_file(const std::string& dir, int rank) {
  return (fs::path(dir) / fmt::format("rank_{}.work.json", rank)).string();
}
std::string log_file(const std::string& dir, int rank) { return (fs::path(dir) / fmt::format("rank_{}.log", rank)).string(); }

std::string marker_path(const std::string& dir, const std::string& what, int rank) {
  return (fs::path(dir) / fmt::format(".{}_{}", what, rank)).string();
}

void touch_marker(const std::string& dir, const char* what, int rank) {
  std::ofstream(marker_path(dir, what, rank)).put('\n');
}

bool wait_markers(const std::string& dir, const char* what, const std::vector<int>& ranks, double timeout_s) {
  const auto t0 = std::chrono::steady_clock::now();
  for (;;) {
    bool all = true;
    for (size_t i = 0; i < ranks.size() && all; ++i) all = fs::exists(marker_path(dir, what, ranks[i]));
    if (all) return true;
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > timeout_s) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

namespace {

void save(const std::string& path, const nlohmann::json& rec) { write_output(path, rec.dump(1) + "\n"); }

TimingOptions fixed_timing() {
  // The same work on every device: a fixed repetition count, never adaptive.
  TimingOptions t;
  t.warmup = 1;
  t.min_reps = t.max_reps = kThroughputRepsPerRound;
  t.min_total_s = 0;
  return t;
}

// A round's value is its fastest repetition: within a round's few repetitions,
// interference (another process, the hypervisor) only slows one down. The rounds
// are spread over the phase (on CPU ranks, the ranks take turns each round), and
// the throughput is the median of the rounds' values (round_median): a spell of
// the host, slow or fast, while one rank is timed moves that rank's one round, not
// its throughput, and a device slow in every round is still slow. A CPU rank holds one BLAS thread through the
// phase and is timed by that thread's CPU time (time_region): with one window of
// 12 repetitions on the process's clock, OpenBLAS's workers spinning after the
// set-up's product put a healthy rank's GEMM 9-12% below the others' in 2 of 6
// four-rank fleets; in rounds on the thread's clock, within 2.2% in 6 of 6. CPU
// time, not the wall clock: a core the hypervisor lends to
// another machine for a while stops that clock too (the wall clock moved by up to
// 35% between identical ranks on the 2-core CI machine, the CPU time by a few %).
double best_s(const Device& dev, const TimeStats& t) {
  if (dev.kind() == BackendKind::cpu && !t.cpu_samples_s.empty())
    return *std::min_element(t.cpu_samples_s.begin(), t.cpu_samples_s.end());
  return t.min_s;
}

nlohmann::json point_json(const Device& dev, const SweepPoint& p, const char* value_key) {
  nlohmann::json j{{"status", p.status}, {"config", p.config}, {"metrics", p.metrics}};
  if (p.status != "ok") j["reason"] = p.reason;
  if (p.time) {
    j["best_s"] = best_s(dev, *p.time), j["min_wall_s"] = p.time->min_s, j["median_wall_s"] = p.time->median_s;
    j["clock"] = dev.kind() == BackendKind::cpu ? "thread CPU time" : "device timer";
    // Which kernels the timed region ran (the step's attention among them), so that
    // ranks timed on different kernels are seen to be.
    if (!p.time->kernel_calls.empty()) j["kernel_calls"] = p.time->kernel_calls;
  }
  j["value"] = p.status == "ok" ? p.metrics.value(value_key, 0.0) : 0.0;
  return j;
}

}  // namespace

// One round's point of a throughput folded into those so far: every round's value,
// their median as the value, and the fastest round's point (its timings, kernels
// and value) under "fastest_round"; a round that did not measure (out of memory) is
// the result from then on, its point under "failed_round".
void fold_round(nlohmann::json& t, nlohmann::json p) {
  nlohmann::json values = t.is_object() ? t["round_values"] : nlohmann::json::array();
  values.push_back(p.value("value", 0.0));
  const bool failed_before = t.is_object() && t.value("status", "ok") != "ok";
  if (!failed_before) {
    if (const std::string status = p.value("status", "ok"); status != "ok") {
      t = {{"status", status}, {"reason", p.value("reason", "")}, {"value", 0.0}, {"failed_round", std::move(p)}};
    } else {
      const bool fastest = !t.is_object() || p.value("value", 0.0) > t["fastest_round"].value("value", 0.0);
      if (!t.is_object()) t = nlohmann::json::object();
      if (fastest) t["fastest_round"] = std::move(p);
      t["status"] = "ok";
      t["value"] = round_median(values);
    }
  }
  t["round_values"] = std::move(values);
}

namespace {

// The three throughputs of a rank, their work set up once (in the first round,
// inside the point's measure, so that running out of memory is the point's status)
// and timed round after round. A round's point: its fastest repetition.
class ThroughputWork {
 public:
  ThroughputWork(Device& dev, int rank) : dev_(dev), rank_(rank) {}

  // One round of the three, folded into the best so far.
  void time_round(int round, nlohmann::json& best) {
    fold_round(best["step"], step(round));
    fold_round(best["gemm"], gemm());
    fold_round(best["copy"], copy());
  }

 private:
  struct Step {
    Step(Device& dev, const StepConfig& cfg)
        : train(dev, cfg), batch(make_lm_batch(dev, cfg.transformer, cfg.batch, cfg.seq_len, 1)) {}
    TrainStep train;
    Batch batch;
  };
  struct Gemm {
    Tensor a, b, c;
  };
  struct Copy {
    Tensor a, b;
  };

  // Tokens per second of one training step (BM-MB's transformer: quick on the CPU,
  // the full preset's on a GPU), no accumulation. The round is in the point's
  // configuration, so that a slowdown can be injected into some rounds only.
  nlohmann::json step(int round) {
    props::MicroBatchSweep s =
        props::microbatch_sweep_config(dev_.kind() == BackendKind::cuda ? Preset::full : Preset::quick, dev_.kind());
    StepConfig cfg = s.base;
    cfg.micro_batch = cfg.batch;
    SweepPoint p = props::sweep_point("FLEET-STEP", dev_, cfg.precision.compute, "transformer",
                                      {{"rank", rank_}, {"round", round}, {"d_model", cfg.transformer.d_model},
                                       {"layers", cfg.transformer.layers}, {"batch", cfg.batch}, {"seq_len", cfg.seq_len}});
    props::measure_point(p, [&] {
      if (!step_) step_ = std::make_unique<Step>(dev_, cfg);
      props::time_point(dev_, p, fixed_timing(), [&] { step_->train.step(step_->batch); });
      p.metrics["tokens_per_s"] = static_cast<double>(cfg.batch * cfg.seq_len) / best_s(dev_, *p.time);
    });
    return point_json(dev_, p, "tokens_per_s");
  }

  // One square matrix product (fp32 n = 1024 on the CPU, bf16 n = 8192 on a GPU): TFLOP/s.
  nlohmann::json gemm() {
    const bool gpu = dev_.kind() == BackendKind::cuda;
    const int64_t n = gpu ? 8192 : 1024;
    const DType dt = gpu ? DType::bf16 : DType::f32;
    SweepPoint p = props::sweep_point("FLEET-GEMM", dev_, dt, "op:matmul", {{"rank", rank_}, {"n", n}});
    props::measure_point(p, [&] {
      if (!gemm_) {
        std::mt19937 gen(7);
        std::uniform_real_distribution<float> u(-1.f, 1.f);
        std::vector<float> host(static_cast<size_t>(n * n));
        for (float& x : host) x = u(gen);
        gemm_ = std::make_unique<Gemm>(Gemm{Tensor::from_host(dev_, host, {n, n}, dt, Consumer::workspace),
                                            Tensor::from_host(dev_, host, {n, n}, dt, Consumer::workspace),
                                            Tensor::zeros(dev_, {n, n}, dt, Consumer::workspace)});
      }
      props::time_point(dev_, p, fixed_timing(), [&] { ops::matmul(gemm_->a, false, gemm_->b, true, gemm_->c); });
      p.metrics["tflops"] = 2.0 * static_cast<double>(n) * n * n / best_s(dev_, *p.time) / 1e12;
    });
    return point_json(dev_, p, "tflops");
  }

  // A device-to-device copy (64 MiB on the CPU, 1 GiB on a GPU): GB/s read plus written.
  nlohmann::json copy() {
    const int64_t floats = dev_.kind() == BackendKind::cuda ? (int64_t{1} << 28) : (int64_t{1} << 24);
    SweepPoint p = props::sweep_point("FLEET-COPY", dev_, DType::f32, "op:copy", {{"rank", rank_}, {"bytes", floats * 4}});
    props::measure_point(p, [&] {
      if (!copy_)
        copy_ = std::make_unique<Copy>(Copy{Tensor::zeros(dev_, {floats}, DType::f32, Consumer::workspace),
                                            Tensor::zeros(dev_, {floats}, DType::f32, Consumer::workspace)});
      props::time_point(dev_, p, fixed_timing(), [&] { copy_->b.copy_from(copy_->a); });
      p.metrics["GBps"] = 2.0 * static_cast<double>(floats * 4) / best_s(dev_, *p.time) / 1e9;
    });
    return point_json(dev_, p, "GBps");
  }

  Device& dev_;
  int rank_;
  std::unique_ptr<Step> step_;
  std::unique_ptr<Gemm> gemm_;
  std::unique_ptr<Copy> copy_;
};

// The ranks behind: those whose value (the median of their rounds) in a judged
// metric lies below the fastest other rank's of its kind by more than `floor`
// (in kinds of 3 or more, those the judge compares), from the records of the ranks
// that timed `rounds` rounds. Behind is not slow: its rounds so far may not yet show
// what it can do, nor the others' (whose median the judge takes) theirs. A metric
// that failed to measure is final (fold_round keeps the failure), so it makes no
// rank behind.
std::vector<int> ranks_behind(const std::string& dir, int size, int rounds, BackendKind backend, double floor) {
  std::map<std::string, std::vector<std::pair<int, nlohmann::json>>> kinds;
  for (int r = 0; r < size; ++r) {
    try {
      const nlohmann::json rec = read_json_file(work_file(dir, r), "a rank's work record", kMaxResultsBytes);
      const nlohmann::json& t = rec.at("throughput");
      bool complete = t.value("rounds", 0) >= rounds;
      for (const Metric& m : kMetrics) complete = complete && t.at(m.key).at("value").is_number();
      if (complete) kinds[kind_of(rec)].emplace_back(r, t);
    } catch (const std::exception&) {
      // No record, or none of the rounds: a rank that never reported is judged
      // failed, and not waited for.
    }
  }
  std::vector<int> out;
  for (const auto& [kind, members] : kinds) {
    if (members.size() < 3) continue;
    for (const Metric& m : kMetrics) {
      if (!judged(m, backend)) continue;
      std::vector<double> best;
      std::vector<bool> measured;
      for (const auto& [r, t] : members) {
        best.push_back(t[m.key]["value"].get<double>());
        measured.push_back(t[m.key].value("status", "ok") == "ok");
      }
      for (size_t i = 0; i < members.size(); ++i) {
        double fastest = 0;
        for (size_t k = 0; k < members.size(); ++k)
          if (k != i && measured[k]) fastest = std::max(fastest, best[k]);
        if (measured[i] && best[i] < (1 - floor) * fastest) out.push_back(members[i].first);
      }
    }
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

// The conformance part of the level: its selection of the registered properties on
// this device, the results kept beside the record.
nlohmann::json conformance(Device& dev, const Level& lv, uint64_t seed, const std::string& results_path) {
  RunOptions opt;
  opt.preset = lv.preset;
  opt.only = lv.only;
  opt.skip = lv.skip;
  opt.seed = seed;
  // The suite's progress lines go to the rank's log (its standard error): where a
  // long level is, and where one stopped.
  Results r = run_suite(dev, opt, &std::cerr);
  save_results(r, results_path);
  nlohmann::json failed = nlohmann::json::array();
  for (const Measurement& m : r.measurements)
    if (!m.passed) failed.push_back(m.check.empty() ? m.id + ": " + m.title : m.check);
  return {{"preset", preset_name(lv.preset)},
          {"only", lv.only},
          {"skip", lv.skip},
          {"measurements", r.totals.measurements},
          {"passed", r.totals.passed},
          {"negative_controls", r.totals.negative_controls},
          {"controls_caught", r.totals.negative_controls_caught},
          {"errors", r.totals.errors},
          {"failed", failed},
          {"seconds", r.duration_s},
          {"results", fs::path(results_path).filename().string()}};
}

}  // namespace

int rank_work(const RankOptions& opt) {
  const RankPlace place = rank_place();
  const Level& lv = level(opt.level);
  // The barriers give up well inside the budget: a rank whose node died or hung must
  // not take the others' budgets with it. The throughput phase's first rounds share
  // one deadline (each of its barriers waiting the whole wait would run past the
  // budget behind one hung rank), the rounds more another, which ends by 0.75 of the
  // budget; a rank missing at a barrier is given up and not waited for again, and
  // past a deadline the live ranks are still waited for, up to a grace each.
  const double budget = opt.budget_s > 0 ? opt.budget_s : lv.budget_s(opt.backend == "cuda" ? BackendKind::cuda : BackendKind::cpu);
  const double ready_wait = std::min(120.0, 0.2 * budget), timed_wait = std::min(900.0, 0.6 * budget);
  const std::string path = work_file(opt.dir, place.rank);
  char host[256] = {0};
  ::gethostname(host, sizeof host - 1);
  const auto t0 = std::chrono::steady_clock::now();
  nlohmann::json rec{{"schema", kRankSchema},     {"rank", place.rank},        {"size", place.size},
                     {"local_rank", place.local_rank}, {"launcher", place.launcher}, {"host", host},
                     {"pid", ::getpid()},          {"level", opt.level},        {"seed", opt.seed},
                     {"backend", opt.backend},     {"build", build_record()},   {"phase", "device"}};
  auto phase = [&](const char* name) {
    rec["phase"] = name;
    rec["seconds"] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    save(path, rec);
  };
  try {
    phase("device");
    std::unique_ptr<Device> dev = make_device(opt.backend);
    rec["device"] = dev->record();
    touch_marker(opt.dir, "ready", place.rank);
    // Every rank's device is up before anyone is timed (a rank still starting would
    // share the host with the first one timed).
    nlohmann::json waits = nlohmann::json::array();
    // The ranks still waited for: a rank missing at a barrier is given up.
    std::vector<int> live(static_cast<size_t>(place.size));
    std::iota(live.begin(), live.end(), 0);
    const double grace = std::min(10.0, 0.05 * budget);
    // A barrier waits for the markers of the live ranks listed, until its deadline
    // or, past it, for a grace.
    auto barrier = [&](const std::string& what, const std::vector<int>& ranks,
                       std::chrono::steady_clock::time_point deadline) {
      std::vector<int> wanted;
      for (int r : ranks)
        if (std::binary_search(live.begin(), live.end(), r)) wanted.push_back(r);
      const double left = std::chrono::duration<double>(deadline - std::chrono::steady_clock::now()).count();
      if (wait_markers(opt.dir, what.c_str(), wanted, std::max(left, grace))) return true;
      // The lowest rank missing is given up; the others may be waiting for it (CPU
      // ranks take turns in rank order), so they get a grace each, in turn.
      bool all = true;
      for (;;) {
        std::vector<int> missing;
        for (int r : wanted)
          if (!fs::exists(marker_path(opt.dir, what, r))) missing.push_back(r);
        if (missing.empty()) return all;
        all = false;
        live.erase(std::find(live.begin(), live.end(), missing.front()));
        waits.push_back(fmt::format("went on at {:.0f} s without rank {} at '{}', and no longer waits for it",
                                    std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
                                    missing.front(), what));
        wanted.assign(missing.begin() + 1, missing.end());
        if (wait_markers(opt.dir, what.c_str(), wanted, grace)) return false;
      }
    };
    const auto below = [](int end) {
      std::vector<int> ranks(static_cast<size_t>(std::max(end, 0)));
      std::iota(ranks.begin(), ranks.end(), 0);
      return ranks;
    };
    const auto after = [](double s) {
      return std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                                    std::chrono::duration<double>(s));
    };
    barrier("ready", below(place.size), after(ready_wait));

    phase("throughput");
    // CPU ranks stand in for devices but share the machine's cores: they are timed
    // one at a time, in rank order, round after round (a rank starts a round when
    // every rank finished the last one and those below it finished this one). GPUs
    // are timed together.
    const bool one_at_a_time = dev->kind() == BackendKind::cpu;
    const auto timed_deadline = after(timed_wait);
    // The rounds more have a deadline of their own (the first rounds' may have
    // passed, behind a hung rank), set when they start, never past 0.75 of the budget.
    auto confirm_deadline = timed_deadline;
    const auto deadline = [&](int round) { return round < kThroughputRounds ? timed_deadline : confirm_deadline; };
    const auto by_budget = t0 + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                    std::chrono::duration<double>(0.75 * budget));
    nlohmann::json best;
    best["timed_alone"] = one_at_a_time;
    // Who was behind after the first rounds, who after the last, how many rounds more
    // followed and why they stopped.
    nlohmann::json confirmation{{"rounds", 0}, {"behind", nlohmann::json::array()}};
    {
      // The set-up's products too: no BLAS pool woken before a timed region.
      const props::OneBlasThread one_blas_thread(*dev);
      ThroughputWork work(*dev, place.rank);
      for (int round = 0;; ++round) {
        // A round starts when every live rank finished the last (CPU ranks each
        // round, GPUs before a decision on a round more).
        if (round > 0 && (one_at_a_time || round >= kThroughputRounds))
          barrier(timed_marker(round - 1), live, deadline(round - 1));
        if (round >= kThroughputRounds) {
          // One rank decides, the lowest live one, from every rank's record, and
          // writes the decision for the others: all agree.
          const int decider = live.empty() ? place.rank : live.front();
          const std::string what = fmt::format("decide_r{}", round);
          nlohmann::json decision;
          if (round == kThroughputRounds) confirm_deadline = std::min(after(std::min(120.0, 0.15 * budget)), by_budget);
          if (decider == place.rank) {
            // The first decision starts rounds more at the lower behind_floor; the
            // later ones go on only while a rank is behind by the slow floor itself.
            const double floor =
                round == kThroughputRounds ? behind_floor(dev->kind()) : slow_floor(dev->kind());
            const std::vector<int> behind = ranks_behind(opt.dir, place.size, round, dev->kind(), floor);
            // The decider's clock alone says whether the rounds' time is up.
            const bool in_time = std::chrono::steady_clock::now() < confirm_deadline;
            const bool more = !behind.empty() && round < kThroughputRounds + kConfirmRounds && in_time;
            decision = {{"round", round}, {"decided_by", decider}, {"behind", behind}, {"more", more},
                        {"stopped", more                 ? ""
                                    : behind.empty()     ? "nobody behind"
                                    : !in_time           ? "the rounds' deadline"
                                                         : "the last round more"}};
            write_output(marker_path(opt.dir, what, decider), decision.dump() + "\n");
          } else if (barrier(what, {decider}, deadline(round))) {
            try {
              decision = read_json_file(marker_path(opt.dir, what, decider),
                                        "the fleet's decision on a round more", kMaxResultsBytes);
            } catch (const std::exception& e) {
              decision = {{"more", false}, {"stopped", std::string("its decision unreadable: ") + e.what()}};
            }
          } else {
            decision = {{"more", false}, {"stopped", fmt::format("no decision from rank {}", decider)}};
          }
          const bool more = decision.is_object() && decision.value("more", false);
          if (round == kThroughputRounds) confirmation["behind"] = decision.value("behind", nlohmann::json::array());
          confirmation["still_behind"] = decision.value("behind", nlohmann::json::array());
          confirmation["stopped"] = decision.value("stopped", "");
          if (!more) break;
          confirmation["rounds"] = round - kThroughputRounds + 1;
          best["confirmation"] = confirmation;
        }
        if (one_at_a_time) {
          std::vector<int> before;
          for (int r : live)
            if (r < place.rank) before.push_back(r);
          barrier(timed_marker(round), before, deadline(round));
        }
        // The control of a rank that hangs while others wait for it at a barrier.
        while (round == 1 && env_int(kInjectHangTimedEnv, -1) == place.rank)
          std::this_thread::sleep_for(std::chrono::seconds(1));
        work.time_round(round, best);
        best["rounds"] = round + 1;
        rec["throughput"] = best;
        save(path, rec);  // before the marker: whoever passes the barrier reads it whole
        touch_marker(opt.dir, timed_marker(round).c_str(), place.rank);
      }
    }
    best["confirmation"] = confirmation;
    rec["throughput"] = std::move(best);
    save(path, rec);
    if (!waits.empty()) rec["barrier_timeouts"] = waits;

    phase("digest");
    if (env_int(kInjectExitEnv, -1) == place.rank) std::_Exit(3);  // the dead-rank control
    while (env_int(kInjectHangEnv, -1) == place.rank) std::this_thread::sleep_for(std::chrono::seconds(1));

    Digest first;
    {
      // The silent-corruption control: one bit of one matrix product's output
      // flipped, in the first digest only (an intermittent fault).
      std::optional<ops::ScopedOpFault> sdc;
      if (env_int(kInjectSdcEnv, -1) == place.rank) {
        ops::OpFault f;
        f.op = "matmul";
        f.flip_on_call = 20;
        sdc.emplace(f);
        rec["injected"] = "HEADROOM_INJECT_SDC: bit 12 of one element of the 20th matrix product flipped";
      }
      first = compute_digest(*dev, opt.seed);
    }
    const Digest again = compute_digest(*dev, opt.seed);
    rec["digest"] = first;
    rec["digest_repeat_sha256"] = again.sha256;
    rec["self_difference"] = difference_json(first_difference(first, again));

    phase("conformance");
    rec["conformance"] = conformance(*dev, lv, opt.seed,
                                     (fs::path(opt.dir) / fmt::format("rank_{}.results.json", place.rank)).string());
    phase("done");
    return 0;
  } catch (const std::exception& e) {
    rec["error"] = error_text(e);
    save(path, rec);
    return 3;
  }
}

namespace {

volatile std::sig_atomic_t g_child = 0;
void forward_term(int sig) {
  if (g_child > 0) ::kill(-static_cast<pid_t>(g_child), SIGKILL);
  ::_exit(128 + sig);
}

}  // namespace

int run_rank(const RankOptions& opt, std::ostream& err) {
  const RankPlace place = rank_place();
  const Level& lv = level(opt.level);
  HR_ARG_CHECK(opt.backend == "cpu" || opt.backend == "cuda", "fleet: the backend is cpu or cuda, got {}", opt.backend);
  const BackendKind backend = opt.backend == "cuda" ? BackendKind::cuda : BackendKind::cpu;
  fs::create_directories(opt.dir);
  const std::string work = work_file(opt.dir, place.rank), final_path = rank_file(opt.dir, place.rank);
  const double budget = opt.budget_s > 0 ? opt.budget_s : lv.budget_s(backend);

  std::vector<std::string> argv{"/proc/self/exe", "fleet-rank", "--child", "--dir", opt.dir, "--level",
                                std::to_string(opt.level), "--seed", std::to_string(opt.seed), "--backend", opt.backend,
                                "--budget", fmt::format("{}", budget)};
  // The child gets its own CUDA_VISIBLE_DEVICES below; CTest's allocation, if any,
  // was bound in this process already and must not be bound again over it.
  std::vector<std::string> env =
      dist::environment_except({"CUDA_VISIBLE_DEVICES=", "CTEST_RESOURCE_GROUP_", "HEADROOM_CTEST_GPUS_BOUND="});
  // Each rank its own GPU: the local_rank-th of those visible (all, when none is named).
  if (backend == BackendKind::cuda) {
    const std::string visible = std::getenv("CUDA_VISIBLE_DEVICES") ? std::getenv("CUDA_VISIBLE_DEVICES") : "";
    const std::vector<std::string> ids = visible.empty() ? std::vector<std::string>{} : split(visible, ',');
    const std::string mine = ids.empty() ? std::to_string(place.local_rank)
                                         : ids[static_cast<size_t>(place.local_rank) % ids.size()];
    env.push_back("CUDA_VISIBLE_DEVICES=" + mine);
  }
  const std::string log = log_file(opt.dir, place.rank);

  const auto t0 = std::chrono::steady_clock::now();
  // The child dies with its supervisor (SIGKILL: a rank past its budget is not
  // asked); a SIGTERM or SIGINT to the supervisor takes the child's group with it.
  dist::ChildOptions copt;
  copt.log_path = log;
  copt.timeout_s = budget;
  copt.death_signal = SIGKILL;
  copt.started = [](int pid) {
    g_child = pid;
    ::signal(SIGTERM, forward_term);
    ::signal(SIGINT, forward_term);
  };
  const dist::ChildRun child = dist::run_child(argv, env, copt);
  g_child = 0;
  nlohmann::json failure;
  const int status = child.status;
  if (!child.ran)
    failure = {{"phase", "launch"}, {"reason", "fork failed"}};
  else if (child.timed_out)
    failure = {{"reason", fmt::format("no result within the level's budget of {:.0f} s: killed", budget)}};
  else if (WIFSIGNALED(status))
    failure = {{"reason", fmt::format("the process died of signal {} ({}){}", WTERMSIG(status), strsignal(WTERMSIG(status)),
                                      WTERMSIG(status) == SIGKILL
                                          ? ": not by its supervisor; the kernel's out-of-memory killer sends it "
                                            "(see dmesg), or an operator"
                                          : "")}};
  else if (WEXITSTATUS(status) != 0)
    failure = {{"reason", fmt::format("the process exited with status {}", WEXITSTATUS(status))}};
  nlohmann::json rec;
  try {
    rec = read_json_file(work, "the rank's work record", kMaxResultsBytes);
  } catch (const std::exception&) {
    rec = {{"schema", kRankSchema}, {"rank", place.rank}, {"size", place.size}, {"phase", "start"}};
  }
  if (failure.is_null() && rec.value("phase", "") != "done")
    failure = {{"reason", "the process ended before its work was done"}};
  if (!failure.is_null()) {
    failure["phase"] = rec.value("phase", "start");
    if (rec.contains("error")) failure["reason"] = failure["reason"].get<std::string>() + ": " + rec["error"].get<std::string>();
  }
  rec["status"] = failure.is_null() ? "ok" : "failed";
  if (!failure.is_null()) rec["failure"] = failure;
  rec["seconds"] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  rec["log"] = fs::path(log).filename().string();
  try {
    save(final_path, rec);
  } catch (const std::exception& e) {
    err << "fleet-rank " << place.rank << ": " << e.what() << "\n";
  }
  // A failed rank no longer holds the others at their barriers.
  touch_marker(opt.dir, "ready", place.rank);
  for (int round = 0; round < kThroughputRounds + kConfirmRounds; ++round)
    touch_marker(opt.dir, timed_marker(round).c_str(), place.rank);
  std::error_code ec;
  fs::remove(work, ec);
  return 0;
}

}  // namespace hr::fleet
