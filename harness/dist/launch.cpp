// Launching the data-parallel worker under mpirun (see launch.hpp).
#include "harness/dist/launch.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>

#include "harness/results/results.hpp"

namespace hr::dist {
namespace fs = std::filesystem;

namespace {
std::mutex g_mu;
std::vector<int> g_ranks{2, 4};

bool executable(const fs::path& p) { return !p.empty() && ::access(p.c_str(), X_OK) == 0 && fs::is_regular_file(p); }

std::string tail(const std::string& path, size_t max_chars) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string s = ss.str();
  return s.size() > max_chars ? "..." + s.substr(s.size() - max_chars) : s;
}
}  // namespace

std::vector<int> dp_rank_counts() {
  std::lock_guard<std::mutex> lk(g_mu);
  return g_ranks;
}

void set_dp_rank_counts(std::vector<int> ranks) {
  std::lock_guard<std::mutex> lk(g_mu);
  g_ranks = std::move(ranks);
}

std::string find_mpirun() {
  if (const char* e = std::getenv("HEADROOM_MPIRUN"); e && *e) return executable(e) ? e : "";
  const char* path = std::getenv("PATH");
  std::stringstream ss(path ? path : "");
  std::string dir;
  while (std::getline(ss, dir, ':'))
    if (!dir.empty() && executable(fs::path(dir) / "mpirun")) return (fs::path(dir) / "mpirun").string();
  return "";
}

std::string find_dp_worker() {
  if (const char* e = std::getenv("HEADROOM_DP_WORKER"); e && *e) return executable(e) ? e : "";
  std::error_code ec;
  const fs::path self = fs::read_symlink("/proc/self/exe", ec);
  if (!ec && executable(self.parent_path() / "headroom-dp")) return (self.parent_path() / "headroom-dp").string();
#ifdef HEADROOM_DP_WORKER_BUILT
  if (executable(HEADROOM_DP_WORKER_BUILT)) return HEADROOM_DP_WORKER_BUILT;
#endif
  return "";
}

std::string dp_unavailable_reason() {
  const std::string worker = find_dp_worker();
  if (worker.empty())
    return "the MPI worker headroom-dp is not built here (MPI not found at configure time, or HEADROOM_ENABLE_MPI=OFF)";
  if (find_mpirun().empty()) return "mpirun not found (install openmpi-bin, or set HEADROOM_MPIRUN)";
  return "";
}

namespace {

// The worker's scratch folders are headroom-dp-<pid>-<time> in the temporary
// folder, removed when the worker returns. One whose process is gone (killed with
// SIGKILL, which nothing can catch) is removed by the next launch.
void remove_stale_scratch() {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(fs::temp_directory_path(), ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("headroom-dp-", 0) != 0) continue;
    const long pid = std::strtol(name.c_str() + 12, nullptr, 10);
    if (pid > 0 && ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) fs::remove_all(e.path(), ec);
  }
}

}  // namespace

std::string log_tail(const std::string& path, size_t max_chars) { return tail(path, max_chars); }

std::vector<std::string> environment_except(const std::vector<std::string>& prefixes) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e)
    if (std::none_of(prefixes.begin(), prefixes.end(),
                     [&](const std::string& p) { return std::strncmp(*e, p.c_str(), p.size()) == 0; }))
      env.emplace_back(*e);
  return env;
}

ChildRun run_child(const std::vector<std::string>& argv, const std::vector<std::string>& env, const ChildOptions& opt) {
  std::vector<std::string> args = argv, vars = env;
  std::vector<char*> cargv, cenv;
  for (auto& a : args) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  for (auto& e : vars) cenv.push_back(e.data());
  cenv.push_back(nullptr);
  const char* log = opt.log_path.c_str();
  const int death_signal = opt.death_signal;
  ChildRun r;
  const auto t0 = std::chrono::steady_clock::now();
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, death_signal);
    if (::getppid() != parent) ::_exit(128 + death_signal);  // we are gone already
    const int fd = ::open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      ::dup2(fd, 1);
      ::dup2(fd, 2);
      if (fd > 2) ::close(fd);
    }
    ::execve(cargv[0], cargv.data(), cenv.data());
    ::_exit(127);
  }
  if (pid < 0) return r;
  // Its group exists before any kill of it below (whichever of the two runs first).
  ::setpgid(pid, pid);
  r.ran = true;
  if (opt.started) opt.started(pid);
  auto last_tick = t0;
  for (;;) {
    if (::waitpid(pid, &r.status, WNOHANG) == pid) break;
    const auto now = std::chrono::steady_clock::now();
    if (std::chrono::duration<double>(now - t0).count() > opt.timeout_s) {
      ::kill(-pid, SIGKILL);
      ::waitpid(pid, &r.status, 0);
      r.timed_out = true;
      break;
    }
    if (opt.tick && now - last_tick >= std::chrono::milliseconds(200)) {
      opt.tick();
      last_tick = now;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

MpirunRun launch_mpirun(int ranks, const std::string& program, const std::vector<std::string>& args,
                        double timeout_s, const std::string& log_path, const std::function<void()>& tick) {
  MpirunRun r;
  const std::string mpirun = find_mpirun();
  if (mpirun.empty()) {
    r.error = "mpirun not found (install openmpi-bin, or set HEADROOM_MPIRUN)";
    return r;
  }
  std::vector<std::string> argv{mpirun, "-np", std::to_string(ranks), "--oversubscribe", "--bind-to", "none",
                                "--mca", "btl", "self,vader", "--mca", "mpi_yield_when_idle", "1"};
  if (const char* extra = std::getenv("HEADROOM_MPIRUN_ARGS"); extra && *extra) {
    std::stringstream ss(extra);
    std::string a;
    while (ss >> a) argv.push_back(a);
  }
  argv.push_back(program);
  argv.insert(argv.end(), args.begin(), args.end());
  for (const auto& a : argv) r.command += (r.command.empty() ? "" : " ") + a;

  // mpirun refuses to run as root (CI containers) unless told it is meant.
  std::vector<std::string> env = environment_except({"OMPI_ALLOW_RUN_AS_ROOT=", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="});
  env.insert(env.begin(), {"OMPI_ALLOW_RUN_AS_ROOT=1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1"});
  // The kernel sends mpirun SIGTERM when this process ends; mpirun passes it on to
  // the ranks.
  ChildOptions opt;
  opt.log_path = log_path;
  opt.timeout_s = timeout_s;
  opt.death_signal = SIGTERM;
  opt.tick = tick;
  const ChildRun c = run_child(argv, env, opt);
  if (!c.ran) {
    r.error = "fork failed";
    return r;
  }
  r.timed_out = c.timed_out;
  r.seconds = c.seconds;
  r.exit_code = WIFEXITED(c.status) && !r.timed_out ? WEXITSTATUS(c.status) : -1;
  return r;
}

WorkerRun run_dp_worker(int ranks, const std::vector<std::string>& args, double timeout_s) {
  WorkerRun r;
  const std::string why = dp_unavailable_reason();
  if (!why.empty()) {
    r.error = why;
    return r;
  }
  remove_stale_scratch();
  const fs::path dir = fs::temp_directory_path() / fmt::format("headroom-dp-{}-{}", ::getpid(),
                                                               std::chrono::steady_clock::now().time_since_epoch().count());
  fs::create_directories(dir);
  const std::string out = (dir / "out.json").string(), log = (dir / "log.txt").string();
  std::vector<std::string> worker_args = args;
  worker_args.push_back("--out");
  worker_args.push_back(out);
  const MpirunRun m = launch_mpirun(ranks, find_dp_worker(), worker_args, timeout_s, log);
  r.command = m.command;
  r.seconds = m.seconds;
  const int code = m.exit_code;
  if (!m.error.empty()) {
    r.error = m.error;
  } else if (m.timed_out) {
    r.error = fmt::format("{} ranks: no result within {:.0f} s; log: {}", ranks, timeout_s, tail(log, 2000));
  } else if ((code == 0 || code == 1) && fs::exists(out)) {
    try {
      r.output = read_json_file(out, "DP worker output", kMaxResultsBytes);
      r.ok = true;
    } catch (const std::exception& e) {
      r.error = e.what();
    }
  } else {
    r.error = fmt::format("{} ranks: the worker exited with {} and wrote no result; log: {}", ranks, code, tail(log, 2000));
  }
  std::error_code ec;
  fs::remove_all(dir, ec);
  return r;
}

}  // namespace hr::dist
