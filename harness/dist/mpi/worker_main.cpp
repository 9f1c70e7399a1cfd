// headroom-dp: the data-parallel worker, one process per rank under mpirun.
//   mpirun -np N headroom-dp properties [--seeds 1-20] [--part all|data_parallel|sharding] [--preset quick]
//                                       [--out FILE]
//   mpirun -np N headroom-dp bench [--preset quick] [--out FILE]
//   mpirun -np N headroom-dp dump --dir DIR [--steps S] [--data-seed D] [--lengths L,..] [--out FILE]
//     (headroom dump --ranks N: DIR holds the dump's conventions.json, whose
//     configuration every rank runs; each writes DIR/rank_<r>/, harness/dist/dp_dump.hpp)
//   ... [--backend cpu|cuda] [--engine mpi|nccl]   (nccl: one GPU per rank, by local rank)
// Every rank runs the same collective work (harness/properties/data_parallel.hpp);
// rank 0 writes the measurements and sweep points as JSON and prints a summary.
// Exit status (of rank 0, which mpirun returns): 0 every check passed and every
// control was caught, 1 one was not, 2 bad usage or an error (the job is aborted so
// no rank is left waiting in a collective).
#include <fmt/format.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "harness/check.hpp"
#include "harness/ctest_gpus.hpp"
#include "harness/device.hpp"
#include "harness/dist/dp_dump.hpp"
#include "harness/dist/mpi/mpi_communicator.hpp"
#include "harness/dist/nccl_communicator.hpp"
#include "harness/output.hpp"
#include "harness/process_limits.hpp"
#include "harness/properties/data_parallel.hpp"
#include "harness/results/results.hpp"

namespace {

struct Args {
  std::string mode, preset = "quick", backend = "cpu", engine = "mpi", out;
  std::vector<uint64_t> seeds{1234};
  hr::props::DpPart part = hr::props::DpPart::all;
  // dump
  std::string dir;
  int64_t steps = 1;
  uint64_t data_seed = 1;
  std::vector<int64_t> lengths;
};


// "7", "1-20" or "3,5,9".
std::vector<uint64_t> parse_seeds(const std::string& s) {
  std::vector<uint64_t> out;
  const size_t dash = s.find('-');
  if (dash != std::string::npos) {
    const uint64_t a = std::stoull(s.substr(0, dash)), b = std::stoull(s.substr(dash + 1));
    for (uint64_t x = a; x <= b; ++x) out.push_back(x);
    return out;
  }
  size_t at = 0;
  while (at <= s.size()) {
    const size_t comma = s.find(',', at);
    out.push_back(std::stoull(s.substr(at, comma == std::string::npos ? std::string::npos : comma - at)));
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  return out;
}

// "100,60,5": the lengths the parent checked (the same list syntax as --seeds).
std::vector<int64_t> parse_lengths(const std::string& s) {
  std::vector<int64_t> out;
  for (uint64_t x : parse_seeds(s)) out.push_back(static_cast<int64_t>(x));
  return out;
}

Args parse(int argc, char** argv) {
  Args a;
  if (argc < 2) throw hr::InvalidArgument("usage: headroom-dp properties|bench|dump [--seed S | --seeds A-B] [--part all|data_parallel|sharding] [--preset quick|full] "
                                          "[--backend cpu|cuda] [--engine mpi|nccl] [--out FILE] [--dir DIR "
                                          "--steps S --data-seed D --lengths L,..]");
  a.mode = argv[1];
  if (a.mode != "properties" && a.mode != "bench" && a.mode != "dump")
    throw hr::InvalidArgument("unknown mode '" + a.mode + "'");
  for (int i = 2; i < argc; ++i) {
    const std::string k = argv[i];
    if (i + 1 >= argc) throw hr::InvalidArgument(k + " needs a value");
    const std::string v = argv[++i];
    if (k == "--preset") a.preset = v;
    else if (k == "--backend") a.backend = v;
    else if (k == "--engine") a.engine = v;
    else if (k == "--out") a.out = v;
    else if (k == "--seed" || k == "--seeds") a.seeds = parse_seeds(v);
    else if (k == "--part") a.part = hr::props::parse_dp_part(v);
    else if (k == "--dir") a.dir = v;
    else if (k == "--steps") a.steps = std::stoll(v);
    else if (k == "--data-seed") a.data_seed = std::stoull(v);
    else if (k == "--lengths") a.lengths = parse_lengths(v);
    else throw hr::InvalidArgument("unknown option " + k);
  }
  if (a.engine != "mpi" && a.engine != "nccl") throw hr::InvalidArgument("--engine: mpi | nccl");
  if (a.engine == "nccl" && a.backend != "cuda") throw hr::InvalidArgument("--engine nccl needs --backend cuda");
  if (a.mode == "dump" && a.dir.empty()) throw hr::InvalidArgument("dump needs --dir (the dump's folder)");
  return a;
}

// Worst error / bound of the checks and the range of control powers, per ID.
bool summarize(const std::vector<hr::Measurement>& ms) {
  struct Row {
    int checks = 0, checks_failed = 0, controls = 0, controls_missed = 0;
    double worst_ratio = 0, min_power = INFINITY, max_power = 0, min_subtle = INFINITY, max_subtle = 0;
  };
  std::map<std::string, Row> rows;
  bool ok = true;
  for (const auto& m : ms) {
    Row& r = rows[m.id];
    if (!m.passed) ok = false;
    if (m.negative_control) {
      ++r.controls;
      if (!m.passed) {
        ++r.controls_missed;
        fmt::print("NOT CAUGHT {}: {} (error {:.3g}, bound {:.3g}, config {})\n", m.id, m.title, m.error, m.tolerance,
                   m.config.dump());
      } else if (m.power) {
        double& lo = m.control == "subtle" ? r.min_subtle : r.min_power;
        double& hi = m.control == "subtle" ? r.max_subtle : r.max_power;
        lo = std::min(lo, *m.power);
        hi = std::max(hi, *m.power);
      }
    } else {
      ++r.checks;
      if (!m.passed) {
        ++r.checks_failed;
        fmt::print("FAILED {}: {} (error {:.3g}, bound {:.3g}, config {})\n", m.id, m.title, m.error, m.tolerance,
                   m.config.dump());
      }
      const double ratio = m.tolerance > 0 ? m.error / m.tolerance : m.error;
      if (!(ratio <= r.worst_ratio)) r.worst_ratio = ratio;
    }
  }
  const auto range = [](double lo, double hi) {
    return lo <= hi ? fmt::format("{:.3g}..{:.3g}", lo, hi) : std::string("-");
  };
  for (const auto& [id, r] : rows)
    fmt::print("{}: {} checks ({} failed), worst error/bound {:.3g}; {} controls ({} not caught), gross power {}, "
               "subtle power {}\n",
               id, r.checks, r.checks_failed, r.worst_ratio, r.controls, r.controls_missed,
               range(r.min_power, r.max_power), range(r.min_subtle, r.max_subtle));
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  hr::bind_ctest_gpus();  // under ctest --resource-spec-file: the GPUs CTest gave this test
  hr::rerun_with_one_blas_thread_under_a_memory_limit(argv);
  hr::dist::MpiSession mpi(&argc, &argv);
  hr::dist::Communicator& world = mpi.comm();
  try {
    const Args a = parse(argc, argv);
    const hr::Preset preset = hr::parse_preset(a.preset);
    // NCCL ranks each take the GPU of their rank on the node (one GPU per rank),
    // found through MPI, so mpirun and Slurm's srun alike.
    std::unique_ptr<hr::Device> dev = a.backend == "cuda"
                                          ? hr::make_cuda_device(a.engine == "nccl" ? mpi.local_rank() : 0)
                                          : hr::make_device(a.backend);
    std::unique_ptr<hr::dist::Communicator> nccl;
    hr::dist::Communicator* comm = &world;
    if (a.engine == "nccl") {
      // nccl-tests' bootstrap: rank 0 makes the unique id, MPI carries it to the others.
      std::vector<uint8_t> id(128);
      if (world.rank() == 0) id = hr::dist::nccl_unique_id();
      world.broadcast(id.data(), id.size(), 0);
      nccl = hr::dist::make_nccl_communicator(id, world.rank(), world.size(), *dev);
      comm = nccl.get();
    }

    nlohmann::json out{{"ranks", comm->size()}, {"engine", comm->engine()}, {"backend", a.backend}};
    std::vector<hr::Measurement> all;
    std::vector<hr::SweepPoint> points;
    if (a.mode == "properties") {
      for (size_t i = 0; i < a.seeds.size(); ++i) {
        hr::props::DpOutput o = hr::props::dp_properties(*dev, *comm, preset, a.seeds[i], a.part);
        for (auto& m : o.measurements) {
          if (a.seeds.size() > 1) m.config["seed"] = a.seeds[i];
          all.push_back(std::move(m));
        }
        if (i == 0) points = std::move(o.points);
      }
    } else if (a.mode == "dump") {
      const nlohmann::json conv = hr::read_json_file(a.dir + "/conventions.json", "dump conventions", 64 << 20);
      hr::StepConfig base;
      base.model = hr::parse_model_kind(conv.at("model").get<std::string>());
      const hr::StepConfig cfg = hr::step_config_from_json(conv.at("config"), base);
      hr::DumpOptions opt;
      opt.steps = a.steps;
      opt.data_seed = a.data_seed;
      opt.lengths = a.lengths;
      out["files"] = hr::dist::dump_rank(*dev, *comm, cfg, opt, a.dir);
    } else {
      points = hr::props::bm_dp(*dev, *comm, preset);
    }
    int rc = 0;
    if (comm->rank() == 0) {
      if (a.mode != "dump") {
        out["measurements"] = all;
        out["sweep_points"] = points;
      }
      hr::make_non_finite_explicit(out);
      if (!a.out.empty()) hr::write_output(a.out, out.dump(1));
      if (a.mode == "properties") rc = summarize(all) ? 0 : 1;
      for (const auto& p : points)
        if (p.sweep == "BM-DP" && p.time)
          fmt::print("BM-DP {} ranks={} {}: median {:.3g} s {}\n", comm->engine(), comm->size(),
                     p.config.value("bytes", int64_t{0}), p.time->median_s, p.metrics.dump());
    }
    nccl.reset();
    return rc;
  } catch (const std::exception& e) {
    fmt::print(stderr, "headroom-dp (rank {}): {}\n", world.rank(), hr::error_text(e));
    mpi.abort(2);
  }
}
