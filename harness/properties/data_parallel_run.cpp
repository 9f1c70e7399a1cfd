// The data-parallel entries of `headroom run`: DP-1..DP-6, their per-rank memory
// and communication numbers (DP-MEM, DP-COMM) and BM-DP, each run by launching the
// headroom-dp worker under mpirun for every rank count (harness/dist/launch.hpp),
// because the collective work needs N processes and the run is one. Where MPI or
// mpirun is absent the entries record a skip with the reason; a failed launch is a
// recorded error, never the end of the run.
#include <fmt/format.h>

#include <map>
#include <mutex>
#include <tuple>

#include "harness/check.hpp"
#include "harness/device.hpp"
#include "harness/dist/launch.hpp"
#include "harness/dist/nccl_communicator.hpp"
#include "harness/registry.hpp"
#include "harness/results/results.hpp"

namespace hr::props {
namespace {

constexpr const char* kDpTitle = "data parallel across processes (DP-1..DP-4) under mpirun";
constexpr double kWorkerTimeoutS = 900;

// Where the ranks of one launch run. A CUDA run on a machine with at least N GPUs
// and a loadable NCCL runs one process per GPU with the NCCL engine (each rank binds
// the GPU of its rank on the node, harness/dist/mpi/worker_main.cpp); otherwise the
// ranks run the CPU backend with MPI, and `why_cpu` says why (it goes into the
// measurements' details and the progress line).
struct Ranks {
  std::vector<std::string> args;
  std::string backend = "cpu";
  std::string why_cpu;
};

Ranks worker_args(const char* mode, const RunContext& ctx, int n) {
  Ranks r;
  if (ctx.device.is_cuda()) {
    const int gpus = cuda_device_count();
    const std::string nccl = dist::nccl_unavailable_reason();
    if (gpus < n)
      r.why_cpu = fmt::format("{} ranks need {} GPUs, this machine has {}: the ranks ran on CPUs under MPI", n, n, gpus);
    else if (!nccl.empty())
      r.why_cpu = fmt::format("NCCL is unavailable ({}): the ranks ran on CPUs under MPI", nccl);
    else
      r.backend = "cuda";
  }
  r.args = {mode, "--preset", preset_name(ctx.preset), "--seed", std::to_string(ctx.seed), "--backend", r.backend,
            "--engine", r.backend == "cuda" ? "nccl" : "mpi"};
  return r;
}

std::string launch_note(int n, const Ranks& r) {
  return r.backend == "cuda" ? fmt::format("mpirun -np {}, one GPU each (NCCL)", n)
                             : fmt::format("mpirun -np {} on CPUs", n);
}

// The points of each properties launch, so DP-MEM need not launch again.
std::mutex g_mu;
std::map<std::tuple<int, int, uint64_t>, std::vector<SweepPoint>> g_points;

SweepPoint skipped_point(const std::string& sweep, const std::string& reason, int ranks) {
  SweepPoint p;
  p.sweep = sweep;
  p.backend = "cpu";
  p.dtype = "fp32";
  p.status = "skipped";
  p.reason = reason;
  if (ranks > 0) p.config = {{"ranks", ranks}};
  return p;
}

std::vector<Measurement> run_dp_properties(RunContext& ctx) {
  std::vector<Measurement> out;
  const std::string why = dist::dp_unavailable_reason();
  // A skip, not a failure: recorded with its reason, so that a comparison against a
  // baseline that ran these checks says they are missing here, and why.
  if (!why.empty()) throw Skipped(why);
  for (int n : dist::dp_rank_counts()) {
    const Ranks ranks = worker_args("properties", ctx, n);
    if (ctx.progress) ctx.progress(launch_note(n, ranks));
    const dist::WorkerRun r = dist::run_dp_worker(n, ranks.args, kWorkerTimeoutS);
    if (!r.ok) {
      Measurement m = make_error_measurement("DP-1", kDpTitle, ranks.backend, r.error);
      m.config = {{"ranks", n}};
      m.details["command"] = r.command;
      if (!ranks.why_cpu.empty()) m.details["ranks_on_cpus"] = ranks.why_cpu;
      out.push_back(std::move(m));
      continue;
    }
    for (const auto& j : r.output.at("measurements")) {
      Measurement m = measurement_from_json(j);
      if (!ranks.why_cpu.empty()) m.details["ranks_on_cpus"] = ranks.why_cpu;
      out.push_back(std::move(m));
    }
    std::vector<SweepPoint> pts;
    for (const auto& j : r.output.at("sweep_points")) pts.push_back(sweep_point_from_json(j));
    std::lock_guard<std::mutex> lk(g_mu);
    g_points[{n, static_cast<int>(ctx.preset), ctx.seed}] = std::move(pts);
  }
  return out;
}

std::vector<SweepPoint> run_worker_points(RunContext& ctx, const char* mode, const std::string& sweep) {
  std::vector<SweepPoint> out;
  const std::string why = dist::dp_unavailable_reason();
  if (!why.empty()) return {skipped_point(sweep, why, 0)};
  for (int n : dist::dp_rank_counts()) {
    if (std::string(mode) == "properties") {
      std::lock_guard<std::mutex> lk(g_mu);
      auto it = g_points.find({n, static_cast<int>(ctx.preset), ctx.seed});
      if (it != g_points.end()) {
        out.insert(out.end(), it->second.begin(), it->second.end());
        continue;
      }
    }
    const Ranks ranks = worker_args(mode, ctx, n);
    if (ctx.progress) ctx.progress(launch_note(n, ranks));
    const dist::WorkerRun r = dist::run_dp_worker(n, ranks.args, kWorkerTimeoutS);
    if (!r.ok) {
      SweepPoint p = skipped_point(sweep, r.error, n);
      p.backend = ranks.backend;
      p.status = "error";
      out.push_back(std::move(p));
      continue;
    }
    for (const auto& j : r.output.at("sweep_points")) out.push_back(sweep_point_from_json(j));
  }
  return out;
}

}  // namespace

HR_REGISTER_PROPERTY(PropertySpec{"DP-1", kDpTitle, 20.0, run_dp_properties, "mpirun"});
HR_REGISTER_SWEEP(SweepSpec{"DP-MEM", "data parallel: bytes per consumer per rank, communication bytes per step", 1.0,
                            [](RunContext& c) { return run_worker_points(c, "properties", "DP-MEM"); }, {},
                            "mpirun"});
HR_REGISTER_SWEEP(SweepSpec{"BM-DP", "all-reduce bus bandwidth against message size; data-parallel step time against N",
                            4.0, [](RunContext& c) { return run_worker_points(c, "bench", "BM-DP"); }, {},
                            "mpirun"});

}  // namespace hr::props
