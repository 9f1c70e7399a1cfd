// run / validate / compare / report: the glue between the runner, results.json,
// the comparison and the HTML report, with the exit codes of the command line.
#include "harness/cli/commands.hpp"

#include <fmt/format.h>
#include <fmt/ostream.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <new>
#include <optional>
#include <set>

#include <csignal>
#include <cstdlib>
#include <cstring>
#include <cstdio>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/file.h>
#include <unistd.h>

#include "harness/check.hpp"
#include "harness/device.hpp"
#include "harness/device_health.hpp"
#include "harness/dist/launch.hpp"
#include "harness/dump/dump.hpp"
#include "harness/output.hpp"
#include "harness/step/memory_model.hpp"
#include "harness/step/step_config.hpp"
#include "harness/text.hpp"
#include "harness/results/junit.hpp"
#include "harness/results/results.hpp"
#include "harness/results/runner.hpp"
#include "kernels/attention/attention.hpp"
#include "kernels/attention/attention_cuda.hpp"
#include "reports/report.hpp"

#ifndef RENAME_EXCHANGE
#define RENAME_EXCHANGE (1 << 1)  // renameat2(2): swap the two paths atomically (Linux 3.15)
#endif

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

// One run per output folder: an advisory lock on DIR/.headroom.lock, held until
// the results and the report are written (the kernel drops it if we die), so two
// runs into one --out cannot leave results.json of one and index.html of the other.
class OutputLock {
 public:
  // lock_name: the lock file's name in dir (a dump, which replaces its folder
  // whole, locks a file beside it instead).
  // create false: a folder without a lock file is held by no one, and none is made.
  explicit OutputLock(const std::string& dir, const std::string& lock_name = ".headroom.lock", bool create = true) {
    const std::string path = (fs::path(dir) / lock_name).string();
    fd_ = ::open(path.c_str(), O_RDWR | O_CLOEXEC | (create ? O_CREAT : 0), 0644);
    if (fd_ < 0 && !create && errno == ENOENT) return;
    HR_ARG_CHECK(fd_ >= 0, "cannot create the lock file {}: {}", path, std::strerror(errno));
    if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      const int why = errno;
      char holder[96] = {};
      const ssize_t n = ::pread(fd_, holder, sizeof holder - 1, 0);
      ::close(fd_);
      std::string who = n > 0 ? std::string(holder, static_cast<size_t>(n)) : std::string("pid ?");
      while (!who.empty() && (who.back() == '\n' || who.back() == ' ')) who.pop_back();
      HR_ARG_CHECK(why != EWOULDBLOCK, "another headroom command ({}) is writing into {}; wait for it or use another --out",
                   who, dir);
      throw InvalidArgument(fmt::format("cannot lock {}: {}", path, std::strerror(why)));
    }
    // Who holds it, for the message of a refused writer. The lock is the kernel's
    // (flock): it goes with its process, so a writer that died holds nothing.
    const std::string who = fmt::format("pid {}, started {}\n", ::getpid(), utc_now_iso8601());
    if (::ftruncate(fd_, 0) == 0 && ::pwrite(fd_, who.data(), who.size(), 0) < 0) {
      // Only for the message; the lock holds without it.
    }
  }
  ~OutputLock() {
    if (fd_ >= 0) ::close(fd_);  // releases the lock
  }
  OutputLock(const OutputLock&) = delete;
  OutputLock& operator=(const OutputLock&) = delete;

 private:
  int fd_ = -1;
};

// SIGINT / SIGTERM while the suite runs: the handler only records the signal (and
// says so); the runner stops between two properties or sweeps and what finished
// is written. The first signal of either kind puts both back to their default, so
// a second one, of either kind, ends the process at once with its own status
// (130 for SIGINT, 143 for SIGTERM); a data-parallel worker dies with it.
volatile std::sig_atomic_t g_stop_signal = 0;

extern "C" void on_stop_signal(int sig) {
  g_stop_signal = sig;
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  ::sigaction(SIGINT, &dfl, nullptr);
  ::sigaction(SIGTERM, &dfl, nullptr);
  static const char msg[] =
      "\nheadroom: stopping after the current property or sweep; what finished will be written (again to stop now)\n";
  const ssize_t ignored = ::write(STDERR_FILENO, msg, sizeof msg - 1);
  (void)ignored;
}

class StopSignals {
 public:
  StopSignals() {
    g_stop_signal = 0;
    struct sigaction sa {};
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = 0;
    ::sigaction(SIGINT, &sa, &old_int_);
    ::sigaction(SIGTERM, &sa, &old_term_);
  }
  ~StopSignals() {
    ::sigaction(SIGINT, &old_int_, nullptr);
    ::sigaction(SIGTERM, &old_term_, nullptr);
  }
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

 private:
  struct sigaction old_int_ {}, old_term_ {};
};

// The exit code of an interrupted run: 128 + the signal, as a shell reports it.
int interrupted_exit_code() { return 128 + static_cast<int>(g_stop_signal); }

struct Written {
  std::string json, html;
  std::string device_lost;  // "ID: error" when the device became unusable (see below)
};

// How many times one `headroom run` continues in a fresh process after its device
// became unusable (HEADROOM_RESTARTS counts them across the exec()s).
constexpr int kMaxDeviceRestarts = 4;

int restarts_so_far() {
  const char* v = std::getenv("HEADROOM_RESTARTS");
  return v != nullptr ? std::atoi(v) : 0;
}

// After each property or sweep on a GPU: is the CUDA context lost (a sticky error)?
// HEADROOM_INJECT_DEVICE_LOST=ID makes the first process answer yes after spec ID,
// to test the recovery on any backend.
bool device_unusable(const Device& dev, const std::string& id, std::string* why) {
  const char* inject = std::getenv("HEADROOM_INJECT_DEVICE_LOST");
  if (inject != nullptr && id == inject && restarts_so_far() == 0) {
    *why = "injected (HEADROOM_INJECT_DEVICE_LOST)";
    return true;
  }
  return dev.kind() == BackendKind::cuda && cuda_context_lost(why);
}

// A run whose results say which GPU attention kernels it used (`from`: a baseline
// validated against, a run resumed) goes on with them: its times are those kernels'.
// HEADROOM_ATTENTION_KERNEL naming others is refused before anything runs.
void adopt_attention_kernel(const Results& r, const std::string& from) {
  // A CUDA file from before the kernels were recorded ran the scalar ones, then the
  // default; a CPU run has none.
  std::string kernel = r.attention_kernel;
  if (kernel.empty() && r.backend == "cuda") kernel = "scalar";
  if (kernel.empty()) return;
  const std::optional<ops::GpuAttentionKernel> k = ops::parse_gpu_attention_kernel(kernel);
  HR_ARG_CHECK(k.has_value(), "{}: attention kernels '{}' unknown", from, kernel);
  const char* env = std::getenv("HEADROOM_ATTENTION_KERNEL");
  HR_ARG_CHECK(env == nullptr || *env == '\0' || kernel == env,
               "HEADROOM_ATTENTION_KERNEL={}: {} ran the {} attention kernels, whose times its own are; unset it to "
               "run those",
               env ? env : "", from, kernel);
  ops::set_gpu_attention_kernel(*k);
  // The data-parallel ranks that mpirun starts read it from the environment.
  setenv("HEADROOM_ATTENTION_KERNEL", kernel.c_str(), 1);
}

// The attention kernels a CUDA run records are the ones asked for; a form this
// device cannot take is refused before anything runs, not replaced call by call by
// the scalar kernels under its name. The default (tensor_core) becomes the scalar
// kernels on a device that cannot take it (before sm_80), said once.
void require_attention_kernel(Device& dev) {
  const ops::GpuAttentionKernel k = ops::gpu_attention_kernel();
  if (!dev.is_cuda()) return;
  std::string why;
  if (ops::gpu_attention_kernel_available(dev, k, DType::bf16, 64, &why)) return;
  HR_ARG_CHECK(ops::gpu_attention_kernel_is_default(),
               "HEADROOM_ATTENTION_KERNEL={}: these kernels cannot run on this device ({}); the run would record "
               "kernels it did not use",
               ops::gpu_attention_kernel_name(k), why);
  fmt::print(stderr, "headroom: attention on the scalar kernels: the {} ones cannot run here ({})\n",
             ops::gpu_attention_kernel_name(k), why);
  ops::set_gpu_attention_kernel(ops::GpuAttentionKernel::scalar);
  setenv("HEADROOM_ATTENTION_KERNEL", "scalar", 1);  // for the ranks mpirun starts
}

// The selection's entries, keyed as finished_specs() keys them ("property:ID").
std::set<std::string> selected_keys(const Selection& sel) {
  std::set<std::string> keys;
  for (const PropertySpec* p : sel.properties) keys.insert("property:" + p->id);
  for (const SweepSpec* s : sel.sweeps) keys.insert("sweep:" + s->id);
  return keys;
}

// A resumed run given a new selection: everything it finished (`finished`, of
// finished_specs(old)) must stay selected (its measurements would otherwise be
// dropped from the file; what was skipped there may be left out), and something
// must be left to run. Refused (InvalidArgument) otherwise, naming the entries.
void check_reselection(const Results& old, const std::map<std::string, FinishedSpec>& finished,
                       const RunOptions& opt, const Selection& sel, const std::string& dir) {
  const std::set<std::string> selected = selected_keys(sel);
  std::vector<std::string> dropped;
  size_t kept = 0;
  for (const SpecTiming& t : old.timings) {  // in run order
    const std::string key = t.kind + ":" + t.id;
    if (finished.count(key) == 0) continue;
    if (selected.count(key) > 0)
      ++kept;
    else
      dropped.push_back(t.kind == "sweep" ? t.id + " (sweep)" : t.id);
  }
  HR_ARG_CHECK(dropped.empty(),
               "--resume {}: the new selection{}{} leaves out what the run finished: {}; select it too, or start a "
               "new run",
               dir, opt.only.empty() ? "" : fmt::format(" --only '{}'", opt.only),
               opt.skip.empty() ? "" : fmt::format(" --skip '{}'", opt.skip), fmt::join(dropped, ", "));
  HR_ARG_CHECK(kept < sel.size(), "--resume {}: the selection{}{} adds nothing to what the run finished", dir,
               opt.only.empty() ? "" : fmt::format(" --only '{}'", opt.only),
               opt.skip.empty() ? "" : fmt::format(" --skip '{}'", opt.skip));
}

// The fields of two build records that differ, "git_sha abc (file) / def (this
// binary), ...", or "" where they are the same.
std::string build_difference(const nlohmann::json& file, const nlohmann::json& here) {
  std::vector<std::string> diffs;
  for (const auto& [key, value] : here.items()) {
    const nlohmann::json other = file.is_object() && file.contains(key) ? file.at(key) : nlohmann::json();
    if (other != value) diffs.push_back(fmt::format("{} {} (file) / {} (this binary)", key, other.dump(), value.dump()));
  }
  if (file.is_object())
    for (const auto& [key, value] : file.items())
      if (!here.contains(key)) diffs.push_back(fmt::format("{} {} (file only)", key, value.dump()));
  if (!file.is_object()) diffs.push_back("no build record in the file");
  return fmt::format("{}", fmt::join(diffs, ", "));
}

// Runs the suite per c and writes results.json and index.html into c.out_dir.
// before_report is called with the run and its device while the device is open.
// preflight is called with the device once it is open, before anything is written
// or run: validate refuses there a baseline this device cannot match.
Written run_and_write(const RunCommand& c, std::ostream& err, Results& r, const report::ReportOptions& ropt,
                      const std::function<void(const Results&, Device&)>& before_report = {},
                      const std::function<void(Device&)>& preflight = {}) {
  RunOptions opt;
  opt.preset = parse_preset(c.preset);
  opt.only = c.only;
  opt.skip = c.skip;
  opt.seed = c.seed;
  opt.dp_ranks = c.dp_ranks;
  opt.stop = &g_stop_signal;
  std::optional<Results> resumed;
  std::map<std::string, FinishedSpec> finished;  // what the resumed run finished
  size_t skipped_there = 0;  // entries it skipped, which run again
  std::string backend = c.backend;
  if (!c.resume_dir.empty()) {
    resumed = load_results((fs::path(c.resume_dir) / "results.json").string());
    // One file is one build (and below, one kind of device): what runs now must be it.
    const std::string differs = build_difference(resumed->build, build_record());
    HR_ARG_CHECK(differs.empty(), "--resume {}: its results were written by another build ({}); start a new run",
                 c.resume_dir, differs);
    const bool reselected = c.only_given || c.skip_given;
    // Entries skipped there (e.g. the data-parallel ones without mpirun) run again.
    finished = finished_specs(*resumed);
    skipped_there = resumed->timings.size() - finished.size();
    // ci/gpu-check reads "there is nothing to resume" and "adds nothing to what the
    // run finished" (check_reselection) as "complete, with this selection".
    HR_ARG_CHECK(resumed->incomplete || reselected || skipped_there > 0,
                 "--resume {}: its results.json is complete and skipped nothing; there is nothing to resume (--only "
                 "or --skip with --resume adds entries its selection left out)",
                 c.resume_dir);
    opt.preset = parse_preset(resumed->preset);
    opt.only = c.only_given ? c.only : resumed->only;
    opt.skip = c.skip_given ? c.skip : resumed->skip;
    opt.seed = resumed->seed;
    opt.dp_ranks = resumed->dp_ranks;
    opt.resume = &*resumed;
    backend = resumed->backend;
    // The rest runs on the attention kernels of what finished.
    adopt_attention_kernel(*resumed, "--resume " + c.resume_dir);
  }
  // A bad --only or --skip, or one that selects nothing, is bad input before
  // anything runs: a run of nothing would check nothing.
  const Selection selection = select_specs(opt);
  HR_ARG_CHECK(selection.size() > 0,
               "the selection{}{} matches no property or sweep (IDs and titles, e.g. 'GA-1', '^BM-MB$'): nothing would "
               "run",
               opt.only.empty() ? "" : fmt::format(" --only '{}'", opt.only),
               opt.skip.empty() ? "" : fmt::format(" --skip '{}'", opt.skip));
  if (resumed && (c.only_given || c.skip_given)) check_reselection(*resumed, finished, opt, selection, c.resume_dir);
  if (!opt.dp_ranks.empty()) dist::set_dp_rank_counts(opt.dp_ranks);
  auto dev = open_device(backend);
  if (resumed) {
    const std::string was = resumed->device.is_object() ? resumed->device.value("name", std::string()) : "";
    HR_ARG_CHECK(was == dev->record().name, "--resume {}: its results were measured on {}, not on this {}; start a "
                 "new run", c.resume_dir, was.empty() ? "an unnamed device" : was, dev->record().name);
  }
  if (preflight) preflight(*dev);
  require_attention_kernel(*dev);
  make_dir(c.out_dir);
  const OutputLock lock(c.out_dir);
  if (skipped_there > 0) {
    // Said once nothing can refuse the run any more, naming those selected.
    std::vector<std::string> again;
    const std::set<std::string> selected = selected_keys(selection);
    for (const SpecTiming& t : resumed->timings) {
      const std::string key = t.kind + ":" + t.id;
      if (selected.count(key) > 0 && finished.count(key) == 0) again.push_back(t.id);
    }
    if (!again.empty()) fmt::print(err, "headroom: what was skipped there is tried again: {}\n", fmt::join(again, ", "));
  }
  // Temporaries of a writer killed mid-write (we hold the folder: none is live),
  // and a previous run's report, which this run's replaces at its end.
  {
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(c.out_dir, ec)) {
      const std::string f = e.path().filename().string();
      if (f.rfind(".results.json.tmp.", 0) == 0 || f.rfind(".index.html.tmp.", 0) == 0) fs::remove(e.path(), ec);
    }
    const fs::path old_report = fs::path(c.out_dir) / "index.html";
    if (fs::is_regular_file(fs::symlink_status(old_report, ec))) fs::remove(old_report, ec);
  }
  const std::string json_path = (fs::path(c.out_dir) / "results.json").string();
  opt.checkpoint = [&](const Results& partial) { save_results(partial, json_path); };
  std::string device_lost;
  opt.device_check = [&](const std::string& id, std::string* why) { return device_unusable(*dev, id, why); };
  opt.device_lost = &device_lost;
  fmt::print(err, "headroom: {} the {} preset on {} ({}){}{}\n", resumed ? "resuming" : "running",
             preset_name(opt.preset), dev->record().name, backend_name(dev->kind()),
             opt.only.empty() ? "" : fmt::format(", only '{}'", opt.only),
             opt.skip.empty() ? "" : fmt::format(", skipping '{}'", opt.skip));
  {
    const StopSignals signals;
    r = run_suite(*dev, opt, &err);
  }
  Written w{(fs::path(c.out_dir) / "results.json").string(), (fs::path(c.out_dir) / "index.html").string(),
            device_lost};
  save_results(r, w.json);
  if (before_report) before_report(r, *dev);
  write_output(w.html, report::render_report(r, ropt));
  return w;
}

// A step that cannot fit is refused before anything is allocated, with the bytes
// the memory model predicts and the bytes the device has (a huge configuration
// would otherwise allocate for minutes before failing). A rough estimate in
// floating point first: sizes far beyond any memory would overflow the model's
// byte counts.
void refuse_what_does_not_fit(const StepConfig& cfg, Device& dev) {
  const double rough = rough_step_bytes(cfg).total;
  const size_t have = dev.record().memory_bytes;
  const double limit = have > 0 ? static_cast<double>(have) : 1e18;
  HR_ARG_CHECK(rough <= 4 * limit,
               "the configuration does not fit: one step needs at least about {:.3g} GB and {} has {:.3g} GB", rough / 1e9,
               dev.record().name, static_cast<double>(have) / 1e9);
  const MemoryPrediction pred = predict_memory(cfg, dev.kind());
  HR_ARG_CHECK(have == 0 || pred.total_peak <= have,
               "the configuration does not fit: one step needs {:.3g} GB at its peak ({:.3g} GB of weights, gradients "
               "and optimizer state, {:.3g} GB of activations) and {} has {:.3g} GB",
               static_cast<double>(pred.total_peak) / 1e9, static_cast<double>(pred.static_bytes()) / 1e9,
               static_cast<double>(pred.activations) / 1e9, dev.record().name, static_cast<double>(have) / 1e9);
}

// A baseline is what a run is judged against: one with nothing in it would make
// any run look fit, so it is refused.
Results load_baseline(const std::string& path) {
  Results base = load_results(path);
  HR_ARG_CHECK(!base.incomplete, "baseline {} is an interrupted run (incomplete: {} not run); finish it with "
               "`headroom run --resume DIR` first", path, base.not_run.size());
  HR_ARG_CHECK(!base.measurements.empty() || !base.sweep_points.empty(),
               "baseline {} has no measurements and no sweep points: there is nothing to judge against", path);
  return base;
}

// A run passes when every measurement passed, no sweep point ended in error and
// something was measured.
bool run_passed(const Results& r) {
  return r.totals.failed == 0 && r.totals.sweep_points_error == 0 && run_kind(r) != "empty";
}

// "headroom: complete run: 717 of 717 measurements passed, ..." with every count a
// reader needs to see what did not pass or did not run.
std::string run_summary_line(const Results& r) {
  const RunTotals& t = r.totals;
  std::string points = fmt::format("{} ok", t.sweep_points_ok);
  if (t.sweep_points_skipped > 0) points += fmt::format(", {} skipped", t.sweep_points_skipped);
  if (t.sweep_points_out_of_memory > 0) points += fmt::format(", {} out of memory", t.sweep_points_out_of_memory);
  if (t.sweep_points_error > 0) points += fmt::format(", {} in error", t.sweep_points_error);
  std::string problems;
  auto add = [&](const std::string& p) { problems += (problems.empty() ? " - " : ", ") + p; };
  if (t.failed - t.errors > 0) add(fmt::format("{} FAILED", t.failed - t.errors));
  if (t.errors > 0) add(fmt::format("{} propert{} threw", t.errors, t.errors == 1 ? "y" : "ies"));
  if (t.sweep_points_error > 0) add(fmt::format("{} sweep point{} in error", t.sweep_points_error,
                                                t.sweep_points_error == 1 ? "" : "s"));
  if (run_kind(r) == "empty") add("nothing was measured");
  return fmt::format("headroom: {} run: {} of {} measurements passed, {} of {} negative controls caught ({} of {} "
                     "subtle), {} sweep points ({}){}{}",
                     run_kind(r), t.passed, t.measurements, t.negative_controls_caught, t.negative_controls,
                     t.subtle_controls_caught, t.subtle_controls, t.sweep_points, points,
                     t.specs_skipped > 0 ? fmt::format(", {} skipped here", t.specs_skipped) : std::string(),
                     problems);
}

template <typename F>
int guarded(std::ostream& err, F&& f) {
  try {
    return f();
  } catch (const InvalidArgument& e) {
    fmt::print(err, "headroom: {}\n", e.what());
    return 2;
  } catch (const std::bad_alloc&) {
    fmt::print(err, "headroom: out of host memory: an allocation failed (the configuration asks for more memory "
                    "than this machine has free)\n");
    return 2;
  } catch (const std::exception& e) {
    fmt::print(err, "headroom: error: {}\n", error_text(e));
    return 2;
  }
}


// A dump's worker ranks get this long (the ranks run the same steps as the one
// process did, a few times over on a small machine).
constexpr double kDumpWorkerTimeoutS = 900;

bool numbered(const std::string& name, const char* prefix) {
  const size_t n = std::strlen(prefix);
  return name.size() > n && name.compare(0, n, prefix) == 0 &&
         name.find_first_not_of("0123456789", n) == std::string::npos;
}

// The first entry under a folder that no dump writes ("" when there is none): at the
// top conventions.json, the lock, *.safetensors, step_<s>/ and rank_<r>/; in a
// step folder *.safetensors; in a rank folder step folders. A dump replaces the
// whole folder, so anything else there is a user's and refuses it.
std::string not_a_dump(const fs::path& dir, const fs::path& rel = {}) {
  enum { top, rank, step } kind = rel.empty() ? top : numbered(rel.filename().string(), "rank_") ? rank : step;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string f = e.path().filename().string();
    const bool file = e.is_regular_file(ec) && !e.is_symlink(ec);
    const bool folder = e.is_directory(ec) && !e.is_symlink(ec);
    const bool tensors = file && e.path().extension() == ".safetensors";
    const bool ok = kind == top    ? tensors || (file && (f == "conventions.json" || f == ".headroom.lock")) ||
                                      (folder && (numbered(f, "step_") || numbered(f, "rank_")))
                    : kind == rank ? folder && numbered(f, "step_")
                                   : tensors;
    if (!ok) return (rel / f).string();
    if (folder) {
      const std::string inner = not_a_dump(e.path(), rel / f);
      if (!inner.empty()) return inner;
    }
  }
  if (ec) return fmt::format("{} (it cannot be listed: {})", rel.empty() ? "what" : rel.string(), ec.message());
  return "";
}

}  // namespace

int command_run(const RunCommand& c, std::ostream& out, std::ostream& err) {
  return guarded(err, [&] {
    Results r;
    RunCommand rc = c;
    if (!rc.resume_dir.empty()) rc.out_dir = rc.resume_dir;
    const Written w = run_and_write(rc, err, r, {});
    if (!w.device_lost.empty() && r.incomplete) {
      // The context is gone for this process: what finished is written (marked
      // incomplete, the failed spec recorded); a fresh process resumes the rest.
      const int restarts = restarts_so_far();
      if (restarts < kMaxDeviceRestarts) {
        fmt::print(err, "headroom: the device is unusable after {}; continuing in a fresh process ({} of at most {}): "
                        "headroom run --resume {}\n",
                   w.device_lost, restarts + 1, kMaxDeviceRestarts, rc.out_dir);
        err.flush();
        out.flush();
        std::fflush(nullptr);
        const std::string count = std::to_string(restarts + 1);
        ::setenv("HEADROOM_RESTARTS", count.c_str(), 1);
        const char* args[] = {"headroom", "run", "--resume", rc.out_dir.c_str(), nullptr};
        ::execv("/proc/self/exe", const_cast<char* const*>(args));
        fmt::print(err, "headroom: could not start a fresh process: {}\n", std::strerror(errno));
      } else {
        fmt::print(err, "headroom: the device became unusable {} times; stopping\n", restarts + 1);
      }
    }
    if (r.incomplete) {
      fmt::print(out, "headroom: interrupted: {} measurements and {} sweep points of what finished are in {} (marked "
                      "incomplete); `headroom run --resume {}` runs the {} not run\n",
                 r.totals.measurements, r.totals.sweep_points, fs::absolute(w.json).string(), rc.out_dir,
                 r.not_run.size());
      return w.device_lost.empty() ? interrupted_exit_code() : 1;
    }
    fmt::print(out, "{}\n", run_summary_line(r));
    fmt::print(out, "headroom: results: {}\nheadroom: report:  {}\n", fs::absolute(w.json).string(),
               fs::absolute(w.html).string());
    if (!c.junit.empty()) {
      write_junit(c.junit, r);
      fmt::print(out, "headroom: junit:   {}\n", fs::absolute(c.junit).string());
    }
    return run_passed(r) ? 0 : 1;
  });
}

int command_dump(const DumpCommand& c, std::ostream& out, std::ostream& err) {
  return guarded(err, [&] {
    const ModelKind model = parse_model_kind(c.model);
    StepConfig cfg = step_config_for(model, parse_preset(c.preset));
    if (!c.config_file.empty()) {
      const nlohmann::json patch = read_json_file(c.config_file, "step configuration", kMaxConfigBytes);
      HR_ARG_CHECK(patch.is_object(), "{}: expected a JSON object of step configuration fields, got {}",
                   c.config_file, patch.type_name());
      // The fields are laid over --model's preset: a file for another model would
      // be read over the wrong sizes.
      if (auto m = patch.find("model"); m != patch.end() && m->is_string() && m->get<std::string>() != c.model)
        throw InvalidArgument(fmt::format("{}: model: the file says '{}' but --model is '{}'; pass --model {}",
                                          c.config_file, m->get<std::string>(), c.model, m->get<std::string>()));
      try {
        cfg = step_config_from_json(patch, cfg);
      } catch (const InvalidArgument& e) {
        throw InvalidArgument(fmt::format("{}: {}", c.config_file, e.what()));
      }
    }
    if (!c.dtype.empty()) cfg.precision.compute = parse_dtype(c.dtype);
    // 0 means "the preset's"; the command line refuses 0 and negatives itself.
    HR_ARG_CHECK(c.batch >= 0, "--batch: must be a positive integer, got {}", c.batch);
    HR_ARG_CHECK(c.micro_batch >= 0, "--micro-batch: must be a positive integer, got {}", c.micro_batch);
    if (c.batch > 0) cfg.batch = c.batch;
    if (c.micro_batch > 0) cfg.micro_batch = c.micro_batch;
    if (c.lora_b_std > 0) {
      HR_ARG_CHECK(cfg.adapters.kind == AdapterKind::lora,
                   "--lora-b-std: needs adapters (\"adapters\": {{\"kind\": \"lora\"}} in --config)");
      cfg.adapters.b_init_std = static_cast<float>(c.lora_b_std);
    }
    DumpOptions opt;
    opt.data_seed = c.data_seed;
    opt.steps = c.steps;
    opt.overflow_steps = c.overflow_steps;
    opt.layout = parse_dump_layout(c.layout);
    opt.lengths = c.lengths;
    opt.ranks = c.ranks;
    if (opt.ranks > 0) {
      // The ranks divide by the window's global real items once; the reference
      // beside them is the single-process step with that normalisation, stepped.
      cfg.loss_norm = LossNormalization::sum_div_window_items;
      opt.steps = std::max<int64_t>(opt.steps, 1);
    }
    validate(cfg);  // a bad configuration is refused before anything is created
    validate(opt, cfg);
    if (opt.ranks > 0) {
      const std::string why = dist::dp_unavailable_reason();
      HR_ARG_CHECK(why.empty(), "--ranks: data parallel cannot run here: {}", why);
    }
    auto dev = open_device(c.backend);
    refuse_what_does_not_fit(cfg, *dev);
    // The dump is one set: written into a fresh folder beside --out and put in its
    // place whole, so a kill or a failure never leaves new weights beside old
    // gradients, nor a previous dump's dropout masks beside a dump without dropout.
    fs::path target = fs::absolute(c.out_dir).lexically_normal();
    if (target.filename().empty()) target = target.parent_path();
    HR_ARG_CHECK(!target.filename().empty() && target != target.root_path(),
                 "--out {}: a dump replaces its whole folder; give a folder below the root", c.out_dir);
    const fs::path parent = target.parent_path();
    make_dir(parent.string());
    const std::string name = target.filename().string();
    // Two locks, both the one every writer takes: the folder's own (DIR/.headroom.lock,
    // which a run into DIR holds: the dump is refused while it runs), and one beside
    // it for the swap, which moves the folder's own lock away with the old folder.
    const OutputLock beside(parent.string(), "." + name + ".headroom.lock");
    std::error_code ec;
    std::optional<OutputLock> held;
    if (fs::is_directory(target, ec)) held.emplace(target.string(), ".headroom.lock", false);
    if (fs::exists(target, ec)) {
      HR_ARG_CHECK(fs::is_directory(target, ec), "--out {}: exists and is not a folder", target.string());
      const std::string odd = not_a_dump(target);
      HR_ARG_CHECK(odd.empty(),
                   "--out {} holds {}, which a dump does not write; a dump replaces its whole folder: give a new "
                   "folder, an empty one or a previous dump's",
                   target.string(), odd);
    }
    std::string tmpl = (parent / ("." + name + ".tmp.XXXXXX")).string();
    HR_ARG_CHECK(::mkdtemp(tmpl.data()) != nullptr, "cannot create a temporary folder beside {}: {}", target.string(),
                 std::strerror(errno));
    const fs::path fresh = tmpl;
    {
      const mode_t mask = ::umask(0);  // mkdtemp makes 0700; a dump folder is for sharing, as mkdir would make it
      ::umask(mask);
      ::chmod(fresh.c_str(), 0777 & ~mask);
    }
    DumpResult r;
    try {
      // The folder put in place is held from the moment it is DIR.
      const OutputLock fresh_lock(fresh.string());
      if (opt.ranks > 0)
        fmt::print(out, "headroom: dump: {} step{} on one process, then on {} ranks under mpirun\n", opt.steps,
                   opt.steps == 1 ? "" : "s", opt.ranks);
      r = dump_model(*dev, cfg, fresh.string(), opt);
      if (opt.ranks > 0) {
        std::vector<std::string> args{"dump",    "--dir",       fresh.string(),
                                      "--steps", std::to_string(opt.steps), "--data-seed",
                                      std::to_string(opt.data_seed), "--backend", backend_name(dev->kind())};
        if (!opt.lengths.empty()) {
          std::string l;
          for (int64_t x : opt.lengths) l += (l.empty() ? "" : ",") + std::to_string(x);
          args.insert(args.end(), {"--lengths", l});
        }
        const dist::WorkerRun w = dist::run_dp_worker(static_cast<int>(opt.ranks), args, kDumpWorkerTimeoutS);
        if (!w.ok) throw Error(fmt::format("the {} data-parallel ranks failed: {}", opt.ranks, w.error));
        const int64_t files = w.output.value("files", int64_t{0});
        fmt::print(out, "headroom: dump: {} ranks wrote {} files each ({:.1f} s)\n", opt.ranks, files, w.seconds);
      }
      if (!fs::exists(target, ec)) {
        if (::rename(fresh.c_str(), target.c_str()) != 0)
          throw Error(fmt::format("cannot move the dump into {}: {}", target.string(), std::strerror(errno)));
      } else if (::renameat2(AT_FDCWD, fresh.c_str(), AT_FDCWD, target.c_str(), RENAME_EXCHANGE) != 0) {
        throw Error(fmt::format("cannot put the dump in place of {}: {}", target.string(), std::strerror(errno)));
      }
    } catch (...) {
      fs::remove_all(fresh, ec);
      throw;
    }
    fs::remove_all(fresh, ec);  // after the exchange: the previous dump
    if (r.steps == 0)
      fmt::print(out, "headroom: dumped one {} forward + backward (loss {:.6g}, {} tensors) on {} into {}\n",
                 model_kind_name(cfg.model), r.loss, r.tensors, backend_name(dev->kind()), target.string());
    else
      fmt::print(out, "headroom: dumped {} {} step{} ({} skipped; first loss {:.6g}, {} tensors) on {} into {}\n",
                 r.steps, model_kind_name(cfg.model), r.steps == 1 ? "" : "s", r.steps_skipped, r.loss, r.tensors,
                 backend_name(dev->kind()), target.string());
    for (const auto& f : r.files)
      fmt::print(out, "  {}\n", (target / fs::path(f).lexically_relative(fresh)).string());
    if (r.nonfinite_gradients > 0) {
      // Kept for inspection, but not a dump to compare against: exit 1, unless the
      // configuration asks for an overflow (fp16 with the loss scaler, whose step
      // skips on exactly this).
      const std::string what = fmt::format("{} of {} gradient values are not finite (inf or NaN)",
                                           r.nonfinite_gradients, r.gradient_values);
      if (r.loss_scaled) {
        fmt::print(err, "headroom: {}: the loss scaler would skip this step (fp16 with loss scaling)\n", what);
        return 0;
      }
      fmt::print(err, "headroom: dump: {}; the step diverged (a loss multiplier or learning rate too large?)\n", what);
      return 1;
    }
    return 0;
  });
}



int command_list(const ListCommand& c, std::ostream& out, std::ostream& err) {
  return guarded(err, [&] {
    const Preset preset = parse_preset(c.preset);
    HR_ARG_CHECK(c.backend == "cpu" || c.backend == "cuda" || c.backend == "auto",
                 "--backend: cpu | cuda | auto, got '{}'", c.backend);
    std::string gpu_why;
    const bool gpu = c.backend == "cuda" || (c.backend == "auto" && cuda_device_available(&gpu_why));
    const std::string dp_why = dist::dp_unavailable_reason();
    struct Row {
      std::string id, kind, title, needs, here;
      double seconds;
    };
    std::vector<Row> rows;
    auto here = [&](const std::string& needs) -> std::string {
      if (needs == "a GPU" && !gpu) return "skipped: needs a GPU";
      if (needs == "mpirun" && !dp_why.empty()) return "skipped: " + dp_why;
      return "runs";
    };
    const BackendKind kind = gpu ? BackendKind::cuda : BackendKind::cpu;
    const ExpectedCosts costs = expected_costs(preset, kind);
    for (const PropertySpec& p : property_registry())
      rows.push_back({p.id, "property", p.title, p.needs, here(p.needs),
                      costs.seconds("property", p.id, p.expected_seconds_quick)});
    for (const SweepSpec& w : sweep_registry())
      rows.push_back({w.id, "sweep", w.title, w.needs, here(w.needs), costs.seconds("sweep", w.id, w.expected_seconds_quick)});
    // Times where runs of this preset on this backend were measured (measured_costs.inc).
    const bool timed = costs.calibrated;
    if (c.json) {
      nlohmann::json j = nlohmann::json::array();
      for (const Row& r : rows)
        j.push_back({{"id", r.id}, {"kind", r.kind}, {"title", r.title}, {"needs", r.needs}, {"here", r.here},
                     {"expected_seconds", timed ? nlohmann::json(r.seconds) : nlohmann::json(nullptr)}});
      fmt::print(out, "{}\n", j.dump(1));
      return 0;
    }
    fmt::print(out, "{:<8} {:<8} {:>6}  {:<20}  {}\n", "ID", "kind", "~time", "here", "title");
    double total = 0;
    for (const Row& r : rows) {
      total += r.seconds;
      const std::string t = timed ? format_duration(r.seconds) : "-";
      const std::string where = r.here.size() > 20 ? r.here.substr(0, 17) + "..." : r.here;
      const auto lines = wrap_text(r.title, kConsoleColumns - 48);
      fmt::print(out, "{:<8} {:<8} {:>6}  {:<20}  {}\n", r.id, r.kind, t, where, lines[0]);
      for (size_t i = 1; i < lines.size(); ++i) fmt::print(out, "{:<48}{}\n", "", lines[i]);
    }
    fmt::print(out, "\n{} entries ({} properties, {} sweeps) in the {} preset on {}", rows.size(),
               property_registry().size(), sweep_registry().size(), preset_name(preset), gpu ? "cuda" : "cpu");
    if (timed)
      fmt::print(out, "; about {} as measured {}", format_duration(total),
                 gpu ? "on an H200 (full preset)" : "on a 2-core CPU (quick preset)");
    fmt::print(out, "\n");
    if (!timed)
      fmt::print(out, "(no measured times for the {} preset on {}: they exist for quick on cpu and full on cuda)\n",
                 preset_name(preset), gpu ? "cuda" : "cpu");
    if (!dp_why.empty()) fmt::print(out, "data parallel: {}\n", dp_why);
    fmt::print(out, "--only and --skip take regular expressions over the IDs and titles, e.g. --only '^GA-' or "
                    "--skip '^(TRADE|BM-FIT)$'\n");
    return 0;
  });
}

int command_fleet(const fleet::FleetOptions& opt, std::ostream& out, std::ostream& err) {
  return guarded(err, [&] { return fleet::run_fleet(opt, out, err); });
}

int command_fleet_rank(const fleet::RankOptions& opt, bool child, std::ostream& err) {
  return guarded(err, [&] { return child ? fleet::rank_work(opt) : fleet::run_rank(opt, err); });
}

int command_info(const std::string& backend, std::ostream& out, std::ostream& err) {
  return guarded(err, [&] {
    auto dev = open_device(backend);
    nlohmann::json j = dev->record();
    std::string why;
    if (!cuda_device_available(&why)) j["cuda_unavailable_reason"] = why;
#if HEADROOM_HAVE_CUDA
    // The cuDNN the attention form would load (only loaded: `info` makes no graph,
    // so it stays quick, also under compute-sanitizer), or why none.
    if (dev->is_cuda()) {
      const std::string lib = ops::cuda::cudnn_attention_library();
      if (!lib.empty()) {
        j["cudnn"] = lib;
      } else {
        std::string no;  // a library that does not load: no graph is made
        ops::gpu_attention_kernel_available(*dev, ops::GpuAttentionKernel::cudnn, DType::bf16, 64, &no);
        j["cudnn_unavailable_reason"] = no;
      }
    }
#endif
    fmt::print(out, "{}\n", j.dump(2));
    return 0;
  });
}

namespace {

// validate's run: the baseline's preset, backend, seed, selection and rank counts
// unless given; a preset or backend given that is not the baseline's cannot match
// and is refused before anything runs.
RunCommand adopt_baseline(const ValidateCommand& c, const Results& base) {
  RunCommand run = c.run;
  HR_ARG_CHECK(!c.given.preset || run.preset == base.preset,
               "--preset {}: the baseline {} ran the {} preset; its checks and sweep points are not this preset's "
               "(leave --preset out to run the baseline's)",
               run.preset, c.baseline, base.preset);
  HR_ARG_CHECK(!c.given.backend || run.backend == "auto" || run.backend == base.backend,
               "--backend {}: the baseline {} ran on {}; leave --backend out to run on the baseline's", run.backend,
               c.baseline, base.backend);
  HR_ARG_CHECK(base.preset == "quick" || base.preset == "full", "baseline {}: unknown preset '{}'", c.baseline,
               base.preset);
  run.preset = base.preset;
  run.backend = base.backend;
  if (!c.given.seed) run.seed = base.seed;
  if (!c.given.only) run.only = base.only;
  if (!c.given.skip) run.skip = base.skip;
  if (!c.given.ranks) run.dp_ranks = base.dp_ranks;
  adopt_attention_kernel(base, "the baseline " + c.baseline);
  return run;
}

// Before anything runs: the device must be the baseline's kind (its backend, name
// and compute capability), or every time would be another device's; --any-device
// compares anyway.
void refuse_unmatchable_device(const ValidateCommand& c, const Results& base, Device& dev) {
  const nlohmann::json here = dev.record();
  auto str = [](const nlohmann::json& d, const char* key) {
    auto it = d.find(key);
    return it == d.end() || it->is_null() ? std::string() : it->is_string() ? it->get<std::string>() : it->dump();
  };
  HR_ARG_CHECK(backend_name(dev.kind()) == base.backend, "the baseline {} ran on {}; this machine runs {}: nothing of "
               "it can be matched here", c.baseline, base.backend, backend_name(dev.kind()));
  if (c.any_device) return;
  const std::string bn = str(base.device, "name"), hn = str(here, "name");
  const std::string bc = str(base.device, "compute_capability"), hc = str(here, "compute_capability");
  HR_ARG_CHECK(bn == hn && bc == hc,
               "the baseline {} ran on '{}'{}, this device is '{}'{}: its times and limits are another device's; "
               "validate against a baseline of this kind of device, or pass --any-device to compare anyway",
               c.baseline, bn, bc.empty() ? "" : fmt::format(" (compute capability {})", bc), hn,
               hc.empty() ? "" : fmt::format(" (compute capability {})", hc));
}

}  // namespace

int command_validate(const ValidateCommand& c, std::ostream& out, std::ostream& err) {
  return guarded(err, [&] {
    HR_ARG_CHECK(!c.baseline.empty(), "validate needs --baseline FILE");
    // No output may be an input: checked before anything is read or run.
    if (!c.results.empty()) {
      refuse_output_over_input(c.html, "--html", {{c.baseline, "--baseline"}, {c.results, "--results"}});
      refuse_output_over_input(c.run.junit, "--junit", {{c.baseline, "--baseline"}, {c.results, "--results"}});
    } else {
      for (const char* name : {"results.json", "index.html"})
        refuse_output_over_input((fs::path(c.run.out_dir) / name).string(), fmt::format("--out's {}", name),
                                 {{c.baseline, "--baseline"}});
      refuse_output_over_input(c.run.junit, "--junit", {{c.baseline, "--baseline"}});
    }
    // The baseline is read first: a bad one is refused before anything runs.
    const Results base = load_baseline(c.baseline);
    Results cur;
    Comparison cmp;
    std::string html_path;
    if (!c.results.empty()) {
      cur = load_results(c.results);
      cmp = compare_results(base, cur, c.compare);
      if (!c.html.empty()) {
        report::ReportOptions ro{&base, &cmp, c.baseline};
        write_output(c.html, report::render_report(cur, ro));
        html_path = c.html;
      }
    } else {
      const RunCommand run = adopt_baseline(c, base);
      if (run.backend == "cuda") {
        std::string why;
        HR_ARG_CHECK(cuda_device_available(&why), "the baseline {} ran on cuda and this machine has no usable GPU ({}): "
                     "nothing of it can be matched here", c.baseline, why);
      }
      CompareOptions copt = c.compare;
      copt.run_is_this_build = true;  // this build's tolerances, the tighter of them and the baseline's
      report::ReportOptions ro{&base, &cmp, c.baseline};
      // A sweep without a re-measure hook of its own is run again once (its points
      // kept for every suspected point of it, with the host's load over that run)
      // and the matching point taken.
      std::map<std::string, std::pair<std::vector<SweepPoint>, HostLoad>> rerun;
      const Written w = run_and_write(
          run, err, cur, ro,
          [&](const Results& r, Device& dev) {
            // A point judged slower is measured again by its sweep on this device
            // before it is called a regression.
            const Remeasure remeasure = [&](const SweepPoint& p) -> std::optional<Remeasured> {
              for (const SweepSpec& spec : sweep_registry()) {
                if (spec.id != p.sweep) continue;
                fmt::print(err, "headroom: re-measuring {} {}: judged slower than the baseline\n", p.sweep,
                           config_label(p.config));
                RunContext ctx{dev, parse_preset(run.preset), run.seed, {}};
                dev.memory().reset_peak();
                const HostSample host0 = sample_host();
                if (spec.remeasure) {
                  std::optional<SweepPoint> q = spec.remeasure(ctx, p);
                  if (!q) return std::nullopt;
                  return Remeasured{std::move(*q), host_load_since(host0)};
                }
                auto it = rerun.find(spec.id);
                if (it == rerun.end()) {
                  std::vector<SweepPoint> points = spec.run(ctx);
                  it = rerun.emplace(spec.id, std::make_pair(std::move(points), host_load_since(host0))).first;
                }
                for (const SweepPoint& q : it->second.first)
                  if (q.backend == p.backend && q.dtype == p.dtype && q.model == p.model && q.config == p.config)
                    return Remeasured{q, it->second.second};
                return std::nullopt;
              }
              return std::nullopt;
            };
            cmp = compare_results(base, r, copt, remeasure);
          },
          [&](Device& dev) { refuse_unmatchable_device(c, base, dev); });
      html_path = w.html;
      fmt::print(out, "headroom: results: {}\n", fs::absolute(w.json).string());
      if (cur.incomplete) {
        fmt::print(out, "headroom: interrupted: no verdict; what finished is in {} (marked incomplete)\n",
                   fs::absolute(w.json).string());
        return interrupted_exit_code();
      }
    }
    fmt::print(out, "{}", format_comparison_text(base, cur, cmp));
    if (!html_path.empty()) fmt::print(out, "headroom: report:  {}\n", fs::absolute(html_path).string());
    if (!c.run.junit.empty()) {
      write_junit(c.run.junit, cur, &cmp);
      fmt::print(out, "headroom: junit:   {}\n", fs::absolute(c.run.junit).string());
    }
    return cmp.fit() ? 0 : 1;
  });
}

int command_compare(const std::string& a, const std::string& b, const std::string& html, std::ostream& out,
                    std::ostream& err, const CompareOptions& opt) {
  return guarded(err, [&] {
    refuse_output_over_input(html, "--html", {{a, "A"}, {b, "B"}});
    const Results base = load_baseline(a);
    const Results cur = load_results(b);
    const Comparison cmp = compare_results(base, cur, opt);
    fmt::print(out, "{}", format_comparison_text(base, cur, cmp));
    if (!html.empty()) {
      report::ReportOptions ro{&base, &cmp, a};
      write_output(html, report::render_report(cur, ro));
      fmt::print(out, "headroom: report:  {}\n", fs::absolute(html).string());
    }
    return cmp.fit() ? 0 : 1;
  });
}

// The peer record of `path`, refused unless it timed a BM-MB point that ran in `r`
// (the same configuration, dtype and backend), so that its ratio is of the same step.
nlohmann::json load_peer(const std::string& path, const Results& r) {
  nlohmann::json p = read_json_file(path, "peer record", size_t{16} << 20);
  HR_ARG_CHECK(p.is_object() && p.contains("forms") && p["forms"].is_array() && !p["forms"].empty(),
               "{}: not a record of ci/peer/torch_step.py (no forms)", path);
  const auto& point = p.value("headroom_point", nlohmann::json());
  HR_ARG_CHECK(point.is_object() && point.contains("config"),
               "{}: the peer timed no headroom point (run it with --point RESULTS)", path);
  const bool found = std::any_of(r.sweep_points.begin(), r.sweep_points.end(), [&](const SweepPoint& q) {
    return q.sweep == "BM-MB" && q.status == "ok" && q.config == point["config"] &&
           q.dtype == point.value("dtype", std::string()) && q.backend == p.value("device", std::string());
  });
  HR_ARG_CHECK(found, "{}: its point (BM-MB {} {}) is not a BM-MB point of these results; time the peer with "
               "--point on this results file",
               path, point.value("dtype", std::string()), point["config"].dump());
  return p;
}

int command_report(const std::string& results, const std::string& baseline, const std::string& html,
                   std::ostream& out, std::ostream& err, const std::string& peer) {
  return guarded(err, [&] {
    HR_ARG_CHECK(!html.empty(), "report needs --html OUT");
    refuse_output_over_input(html, "--html", {{results, "RESULTS"}, {baseline, "--baseline"}, {peer, "--peer"}});
    const Results cur = load_results(results);
    nlohmann::json peer_record;
    if (!peer.empty()) peer_record = load_peer(peer, cur);
    std::optional<Results> base;
    std::optional<Comparison> cmp;
    report::ReportOptions ro;
    if (!baseline.empty()) {
      base = load_baseline(baseline);
      cmp = compare_results(*base, cur);
      ro = report::ReportOptions{&*base, &*cmp, baseline};
    }
    if (!peer.empty()) ro.peer = &peer_record;
    write_output(html, report::render_report(cur, ro));
    fmt::print(out, "headroom: report:  {}\n", fs::absolute(html).string());
    return 0;
  });
}

}  // namespace hr
