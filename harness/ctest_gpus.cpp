// CTest's GPU allocation to CUDA_VISIBLE_DEVICES (see ctest_gpus.hpp).
#include "harness/ctest_gpus.hpp"

#include <unistd.h>

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>

#include "harness/check.hpp"
#include "harness/text.hpp"

namespace hr {

namespace {

bool all_digits(const std::string& s) {
  return !s.empty() && s.size() <= 6 && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

double monotonic_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// This process's slot record, when HEADROOM_CTEST_SLOT_LOG asked for one. A
// function's static: built on first use, whichever static initialiser calls first,
// and destroyed after record_end (registered with atexit after it was built) ran.
std::string& slot_file() {
  static std::string path;
  return path;
}

void record_end() {
  std::ofstream(slot_file(), std::ios::app) << fmt::format("end {:.6f}\n", monotonic_s());
}

std::string command_line() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  std::string raw((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::replace(raw.begin(), raw.end(), '\0', ' ');
  while (!raw.empty() && raw.back() == ' ') raw.pop_back();
  return raw;
}

}  // namespace

std::vector<std::string> ctest_gpu_ids(const char* (*getenv_fn)(const char*)) {
  const char* count_s = getenv_fn("CTEST_RESOURCE_GROUP_COUNT");
  if (count_s == nullptr || *count_s == '\0') return {};
  HR_ARG_CHECK(all_digits(count_s), "CTEST_RESOURCE_GROUP_COUNT is not a count: '{}'", count_s);
  const int count = std::atoi(count_s);
  std::vector<std::string> ids;
  for (int g = 0; g < count; ++g) {
    const std::string group_var = fmt::format("CTEST_RESOURCE_GROUP_{}", g);
    const char* types = getenv_fn(group_var.c_str());
    HR_ARG_CHECK(types != nullptr, "{} is missing (CTEST_RESOURCE_GROUP_COUNT={})", group_var, count);
    const std::vector<std::string> type_list = split(types, ',');
    if (std::find(type_list.begin(), type_list.end(), "gpus") == type_list.end()) continue;
    const std::string var = group_var + "_GPUS";
    const char* alloc = getenv_fn(var.c_str());
    HR_ARG_CHECK(alloc != nullptr && *alloc != '\0', "{} names gpus but {} is missing", group_var, var);
    // One allocation per requirement of the group: id:<id>,slots:<n>[;id:...].
    for (const std::string& one : split(alloc, ';')) {
      std::string id;
      bool slots = false;
      for (const std::string& field : split(one, ',')) {
        if (field.rfind("id:", 0) == 0) id = field.substr(3);
        else if (field.rfind("slots:", 0) == 0) slots = all_digits(field.substr(6));
        else HR_ARG_CHECK(false, "{}: unexpected field '{}' in '{}'", var, field, alloc);
      }
      HR_ARG_CHECK(all_digits(id) && slots, "{}: '{}' is not id:<GPU index>,slots:<n> (ci/ctest-resources writes GPU "
                   "indices as ids)", var, one);
      if (std::find(ids.begin(), ids.end(), id) == ids.end()) ids.push_back(id);
    }
  }
  return ids;
}

std::string ctest_visible_devices(const std::vector<std::string>& ids, const char* visible) {
  // Set but empty: the runner hid every GPU, and none may be given back.
  const std::vector<std::string> before =
      visible == nullptr || *visible == '\0' ? std::vector<std::string>{} : split(visible, ',');
  std::string out;
  for (const std::string& id : ids) {
    const size_t index = static_cast<size_t>(std::stoul(id));
    std::string device = id;
    if (visible != nullptr) {
      HR_ARG_CHECK(index < before.size(), "CTest gave GPU {} but CUDA_VISIBLE_DEVICES={} names {} device{}", id, visible,
                   before.size(), before.size() == 1 ? "" : "s");
      device = before[index];
    }
    out += (out.empty() ? "" : ",") + device;
  }
  return out;
}

std::vector<std::string> bind_ctest_gpus() {
  std::vector<std::string> ids;
  std::string binding;
  try {
    ids = ctest_gpu_ids([](const char* n) -> const char* { return std::getenv(n); });
    if (!ids.empty()) {
      const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
      const char* bound = std::getenv("HEADROOM_CTEST_GPUS_BOUND");
      if (bound != nullptr && visible != nullptr && std::string(bound) == visible) {
        // Bound already by the process that started this one (a re-exec, an mpirun
        // rank of a test): mapping again would index the narrowed list.
        binding = visible;
      } else {
        // The allocation check's control: the binding ignores what CTest gave and
        // takes the GPU named here (the ids reported stay CTest's).
        const char* forced = std::getenv("HEADROOM_INJECT_CTEST_SLOT");
        const bool wrong = forced != nullptr && all_digits(forced);
        binding = ctest_visible_devices(wrong ? std::vector<std::string>{forced} : ids, visible);
        ::setenv("CUDA_VISIBLE_DEVICES", binding.c_str(), 1);
        ::setenv("HEADROOM_CTEST_GPUS_BOUND", binding.c_str(), 1);
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "headroom: CTest's GPU allocation: %s\n", e.what());
    std::exit(2);
  }
  const char* log = std::getenv("HEADROOM_CTEST_SLOT_LOG");
  if (log != nullptr && *log != '\0' && std::getenv("CTEST_RESOURCE_GROUP_COUNT") != nullptr && slot_file().empty()) {
    slot_file() = fmt::format("{}/{}.slot", log, ::getpid());
    // What CTest gave (its variable as it is) and what the process now sees.
    const char* given = std::getenv("CTEST_RESOURCE_GROUP_0_GPUS");
    const char* now = std::getenv("CUDA_VISIBLE_DEVICES");
    std::ofstream(slot_file()) << fmt::format("command {}\nallocation {}\nvisible {}\nstart {:.6f}\n", command_line(),
                                              given ? given : "", now ? now : "", monotonic_s());
    std::atexit(record_end);
  }
  return ids;
}

}  // namespace hr
