// Shared GoogleTest support: per-backend device acquisition that skips honestly
// when no GPU is present (or fails under HEADROOM_REQUIRE_GPU=1), the
// backend x dtype parameter space, random non-zero inputs, and a scratch folder.
#pragma once

#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "harness/device.hpp"
#include "harness/dtype.hpp"
#include "harness/results/results.hpp"

namespace hr {

namespace test {
// Sets an environment variable for one scope, and puts back what was there.
struct ScopedEnv {
  std::string name, old;
  bool had = false;
  ScopedEnv(const char* n, const char* value) : name(n) {
    if (const char* v = std::getenv(n)) had = true, old = v;
    ::setenv(n, value, 1);
  }
  ~ScopedEnv() {
    if (had) ::setenv(name.c_str(), old.c_str(), 1);
    else ::unsetenv(name.c_str());
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;
};

// A fresh empty folder under the system temp dir, named after the running test and
// removed at the end.
struct TempDir {
  std::filesystem::path path;
  TempDir() {
    std::string name = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::replace(name.begin(), name.end(), '/', '_');  // a parameterised test's name: one folder, not two
    path = std::filesystem::temp_directory_path() / ("headroom_test_" + std::to_string(::getpid()) + "_" + name);
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
};

// A host record that a comparison calls busy: 1.5 of 2 CPUs busy with other work,
// none stolen.
inline HostLoad busy_host_load() {
  HostLoad busy;
  busy.cpus = 2;
  busy.other_busy_cpus = 1.5;
  busy.steal_fraction = 0;
  return busy;
}
}  // namespace test
inline void PrintTo(BackendKind k, std::ostream* os) { *os << backend_name(k); }
inline void PrintTo(DType t, std::ostream* os) { *os << dtype_name(t); }
}  // namespace hr

namespace hr::test {

inline bool gpu_required() {
  const char* v = std::getenv("HEADROOM_REQUIRE_GPU");
  return v != nullptr && std::string(v) == "1";
}

// One device per backend per test process (a CUDA context is costly to create).
inline Device* shared_device(BackendKind kind, std::string* why_not) {
  if (kind == BackendKind::cpu) {
    static const std::unique_ptr<Device> cpu = make_cpu_device();
    return cpu.get();
  }
  // A static of its own, constructed after the CUDA runtime has started, so that it
  // is destroyed at exit before the runtime tears the context down (destroyed later,
  // cuBLAS's workspace and the pool are reported as leaks by compute-sanitizer).
  static std::string why;
  static const std::unique_ptr<Device> cuda = cuda_device_available(&why) ? make_cuda_device(0) : nullptr;
  if (!cuda && why_not != nullptr) *why_not = why;
  return cuda.get();
}

// The process's CPU device (always there).
inline Device& cpu_device() { return *shared_device(BackendKind::cpu, nullptr); }

}  // namespace hr::test

// Declares `hr::Device& var` for `kind`, or skips the test with the reason when the
// backend has no device here; with HEADROOM_REQUIRE_GPU=1 a missing GPU fails.
#define HR_TEST_DEVICE(var, kind)                                                          \
  std::string hr_why_not_##var;                                                            \
  ::hr::Device* hr_dev_ptr_##var = ::hr::test::shared_device((kind), &hr_why_not_##var);   \
  if (hr_dev_ptr_##var == nullptr) {                                                       \
    if (::hr::test::gpu_required()) FAIL() << "HEADROOM_REQUIRE_GPU=1 but " << hr_why_not_##var; \
    GTEST_SKIP() << hr_why_not_##var;                                                      \
  }                                                                                        \
  ::hr::Device& var = *hr_dev_ptr_##var

namespace hr::test {

// Parameter of per-backend x dtype tests; prints as "cpu_fp32", "cuda_bf16".
struct BackendDType {
  BackendKind backend;
  DType dtype;
};

inline void PrintTo(const BackendDType& p, std::ostream* os) {
  *os << backend_name(p.backend) << "_" << dtype_name(p.dtype);
}

inline std::string param_name(const testing::TestParamInfo<BackendDType>& info) {
  return std::string(backend_name(info.param.backend)) + "_" + dtype_name(info.param.dtype);
}

inline std::vector<BackendDType> all_backend_dtypes() {
  std::vector<BackendDType> v;
  for (BackendKind b : {BackendKind::cpu, BackendKind::cuda})
    for (DType d : kFloatDTypes) v.push_back({b, d});
  return v;
}

inline std::string backend_param_name(const testing::TestParamInfo<BackendKind>& info) {
  return backend_name(info.param);
}

// Uniform values in [lo, hi) with no exact zeros; deterministic per seed.
inline std::vector<float> random_nonzero(size_t n, uint64_t seed, float lo = -1.f, float hi = 1.f) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) {
    do x = u(rng);
    while (x == 0.f);
  }
  return v;
}

}  // namespace hr::test
