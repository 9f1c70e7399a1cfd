// CTest's GPU allocation read from its environment variables
// (harness/ctest_gpus.hpp): the ids in group order, the binding through a
// CUDA_VISIBLE_DEVICES that was already set, and malformed allocations refused.
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "harness/check.hpp"
#include "harness/ctest_gpus.hpp"
#include "harness/text.hpp"
#include "suites/common/test_support.hpp"

namespace {

std::map<std::string, std::string> g_env;
const char* lookup(const char* name) {
  auto it = g_env.find(name);
  return it == g_env.end() ? nullptr : it->second.c_str();
}

TEST(CtestGpus, NoAllocationMeansNoIds) {
  g_env = {};
  EXPECT_TRUE(hr::ctest_gpu_ids(lookup).empty());
  g_env = {{"CTEST_RESOURCE_GROUP_COUNT", "1"}, {"CTEST_RESOURCE_GROUP_0", "crypto_chips"},
           {"CTEST_RESOURCE_GROUP_0_CRYPTO_CHIPS", "id:card,slots:1"}};
  EXPECT_TRUE(hr::ctest_gpu_ids(lookup).empty());  // a group of another type
}

TEST(CtestGpus, IdsComeInGroupOrderOnceEach) {
  g_env = {{"CTEST_RESOURCE_GROUP_COUNT", "3"},
           {"CTEST_RESOURCE_GROUP_0", "gpus"},
           {"CTEST_RESOURCE_GROUP_0_GPUS", "id:5,slots:1"},
           {"CTEST_RESOURCE_GROUP_1", "crypto_chips,gpus"},
           {"CTEST_RESOURCE_GROUP_1_GPUS", "id:2,slots:1;id:5,slots:2"},
           {"CTEST_RESOURCE_GROUP_1_CRYPTO_CHIPS", "id:card,slots:1"},
           {"CTEST_RESOURCE_GROUP_2", "gpus"},
           {"CTEST_RESOURCE_GROUP_2_GPUS", "id:0,slots:1"}};
  EXPECT_EQ(hr::ctest_gpu_ids(lookup), (std::vector<std::string>{"5", "2", "0"}));
}

// The list splitter both the binding and the fleet's per-rank GPU use.
TEST(CtestGpus, ListsSplitIntoEveryFieldEmptyOnesIncluded) {
  EXPECT_EQ(hr::split("4,6,7", ','), (std::vector<std::string>{"4", "6", "7"}));
  EXPECT_EQ(hr::split("a,,b,", ','), (std::vector<std::string>{"a", "", "b", ""}));
  EXPECT_EQ(hr::split("", ','), (std::vector<std::string>{""}));
  EXPECT_EQ(hr::split("id:1,slots:1;id:2,slots:1", ';'), (std::vector<std::string>{"id:1,slots:1", "id:2,slots:1"}));
}

TEST(CtestGpus, IdsIndexTheDevicesTheRunnerLeftVisible) {
  EXPECT_EQ(hr::ctest_visible_devices({"3"}, nullptr), "3");
  EXPECT_EQ(hr::ctest_visible_devices({"1", "0"}, nullptr), "1,0");
  EXPECT_EQ(hr::ctest_visible_devices({"1"}, "4,6,7"), "6");
  EXPECT_EQ(hr::ctest_visible_devices({"2", "0"}, "GPU-aa,GPU-bb,GPU-cc"), "GPU-cc,GPU-aa");
  EXPECT_THROW(hr::ctest_visible_devices({"3"}, "4,6,7"), hr::InvalidArgument);
  EXPECT_THROW(hr::ctest_visible_devices({"0"}, ""), hr::InvalidArgument);  // the runner hid every GPU
}

TEST(CtestGpus, MalformedAllocationsAreRefused) {
  const std::map<std::string, std::string> bad[] = {
      {{"CTEST_RESOURCE_GROUP_COUNT", "two"}},
      {{"CTEST_RESOURCE_GROUP_COUNT", "1"}},  // group 0 missing
      {{"CTEST_RESOURCE_GROUP_COUNT", "1"}, {"CTEST_RESOURCE_GROUP_0", "gpus"}},  // its allocation missing
      {{"CTEST_RESOURCE_GROUP_COUNT", "1"}, {"CTEST_RESOURCE_GROUP_0", "gpus"}, {"CTEST_RESOURCE_GROUP_0_GPUS", "id:gpu_a,slots:1"}},
      {{"CTEST_RESOURCE_GROUP_COUNT", "1"}, {"CTEST_RESOURCE_GROUP_0", "gpus"}, {"CTEST_RESOURCE_GROUP_0_GPUS", "id:1"}},
      {{"CTEST_RESOURCE_GROUP_COUNT", "1"}, {"CTEST_RESOURCE_GROUP_0", "gpus"}, {"CTEST_RESOURCE_GROUP_0_GPUS", "id:1,slots:1,x:2"}},
  };
  for (const auto& env : bad) {
    g_env = env;
    EXPECT_THROW(hr::ctest_gpu_ids(lookup), hr::InvalidArgument) << env.begin()->second;
  }
}

// The binding in a process's environment: the allocated index picks from the
// devices the runner left visible, once; a process started by a bound one (a
// re-exec, an mpirun rank) keeps the binding instead of indexing the narrowed list;
// the control switch binds to the slot it names.
TEST(CtestGpus, TheBindingIsMadeOnceAndInherited) {
  using hr::test::ScopedEnv;
  ::unsetenv("HEADROOM_CTEST_GPUS_BOUND");
  const ScopedEnv count("CTEST_RESOURCE_GROUP_COUNT", "1"), group("CTEST_RESOURCE_GROUP_0", "gpus"),
      alloc("CTEST_RESOURCE_GROUP_0_GPUS", "id:1,slots:1"), visible("CUDA_VISIBLE_DEVICES", "4,6,7");
  EXPECT_EQ(hr::bind_ctest_gpus(), (std::vector<std::string>{"1"}));
  EXPECT_STREQ(std::getenv("CUDA_VISIBLE_DEVICES"), "6");
  EXPECT_STREQ(std::getenv("HEADROOM_CTEST_GPUS_BOUND"), "6");
  hr::bind_ctest_gpus();  // as the child would: index 1 of "6" does not exist
  EXPECT_STREQ(std::getenv("CUDA_VISIBLE_DEVICES"), "6");
  ::unsetenv("HEADROOM_CTEST_GPUS_BOUND");
  {
    const ScopedEnv all("CUDA_VISIBLE_DEVICES", "4,6,7"), forced("HEADROOM_INJECT_CTEST_SLOT", "0");
    EXPECT_EQ(hr::bind_ctest_gpus(), (std::vector<std::string>{"1"}));  // CTest's, as given
    EXPECT_STREQ(std::getenv("CUDA_VISIBLE_DEVICES"), "4");             // but bound to slot 0
  }
  ::unsetenv("HEADROOM_CTEST_GPUS_BOUND");
}

}  // namespace
