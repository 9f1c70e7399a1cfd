// Data parallelism within one process: the communicator's byte counting, the DP
// properties on the single-process communicator (N = 1: the checks hold; the
// controls need N > 1 and run under mpirun, ctest label mpi), NCCL with one rank on
// a GPU (skipped with the reason elsewhere), and the launcher `headroom run` uses:
// a skip with its reason when mpirun is absent, two real ranks when it is present.
#include <gtest/gtest.h>

#include <cstdlib>

#include "harness/check.hpp"
#include "harness/dist/communicator.hpp"
#include "harness/dist/launch.hpp"
#include "harness/dist/nccl_communicator.hpp"
#include "harness/properties/data_parallel.hpp"
#include "harness/tensor.hpp"
#include "suites/common/property_check.hpp"
#include "suites/common/test_support.hpp"

namespace {

using hr::Measurement;

TEST(DataParallel, CommunicatorCountsPayloadAndBusBytes) {
  auto comm = hr::dist::make_single_communicator();
  std::vector<float> v = hr::test::random_nonzero(10, 3);
  const std::vector<float> before = v;
  comm->all_reduce_sum(v.data(), v.size(), hr::dist::CommDType::f32);
  EXPECT_EQ(v, before);  // one rank: the sum is itself
  std::vector<float> gathered(10);
  comm->all_gather(v.data(), gathered.data(), v.size(), hr::dist::CommDType::f32);
  EXPECT_EQ(gathered, before);
  EXPECT_EQ(comm->stats().calls, 2u);
  EXPECT_EQ(comm->stats().payload_bytes, 80u);
  EXPECT_EQ(comm->stats().bus_bytes, 0.0);  // nothing crosses a link with one rank
  // nccl-tests' factors.
  EXPECT_DOUBLE_EQ(hr::dist::all_reduce_bus_factor(4), 1.5);
  EXPECT_DOUBLE_EQ(hr::dist::all_gather_bus_factor(4), 0.75);
}

// One rank: every DP check holds (the comparison with the full batch, the two
// synchronisation modes, ZeRO-1 bitwise). The controls that need N > 1 (dividing
// by N twice, one rank skipping the all-reduce) cannot show anything here.
TEST(DataParallel, SingleRankChecksHold) {
  HR_TEST_DEVICE(dev, hr::BackendKind::cpu);
  auto comm = hr::dist::make_single_communicator();
  const hr::props::DpOutput o = hr::props::dp_properties(dev, *comm, hr::Preset::quick, 5);
  size_t checks = 0;
  for (const Measurement& m : o.measurements) {
    if (m.negative_control) continue;
    ++checks;
    EXPECT_TRUE(hr::test::passed(m)) << hr::test::describe(m);
  }
  EXPECT_GE(checks, 8u);
  EXPECT_FALSE(o.points.empty());
}

// NCCL with one rank (no MPI needed): the GPU smoke test, also run from the GPU bundle.
TEST(DataParallelCuda, NcclOneRankSmoke) {
  HR_TEST_DEVICE(dev, hr::BackendKind::cuda);
  const std::string why = hr::dist::nccl_unavailable_reason();
  if (!why.empty()) GTEST_SKIP() << "NCCL: " << why;
  auto comm = hr::dist::make_nccl_communicator(hr::dist::nccl_unique_id(), 0, 1, dev);
  const std::vector<float> v = hr::test::random_nonzero(1000, 7);
  hr::Tensor t = hr::Tensor::from_host(dev, v, {1000}, hr::DType::f32, hr::Consumer::workspace);
  comm->all_reduce_sum(t.data(), 1000, hr::dist::CommDType::f32);
  const size_t waits = dev.host_syncs();
  comm->synchronize();
  EXPECT_EQ(dev.host_syncs(), waits + 1) << "the communicator's wait is the device's";
  EXPECT_EQ(t.to_host_f32(), v);
  for (int i = 0; i < 3; ++i) comm->barrier();  // one kept byte serves every barrier
  const hr::props::DpOutput o = hr::props::dp_properties(dev, *comm, hr::Preset::quick, 5);
  for (const Measurement& m : o.measurements)
    if (!m.negative_control) EXPECT_TRUE(hr::test::passed(m)) << hr::test::describe(m);
}

const hr::PropertySpec& dp_spec() {
  for (const auto& p : hr::property_registry())
    if (p.id == "DP-1") return p;
  throw std::runtime_error("DP-1 is not registered");
}

const hr::SweepSpec& sweep_spec(const std::string& id) {
  for (const auto& s : hr::sweep_registry())
    if (s.id == id) return s;
  throw std::runtime_error(id + " is not registered");
}

// Without mpirun the DP entries are a stated skip: the properties throw Skipped with
// the reason (the runner records the spec as skipped, so a comparison against a
// baseline that ran them calls them missing) and DP-MEM records a skipped point.
TEST(DataParallel, MissingMpirunIsASkipWithItsReason) {
  HR_TEST_DEVICE(dev, hr::BackendKind::cpu);
  const char* old = std::getenv("HEADROOM_MPIRUN");
  const std::string saved = old ? old : "";
  ::setenv("HEADROOM_MPIRUN", "/nonexistent/mpirun", 1);
  hr::RunContext ctx{dev};
  std::string skipped;
  try {
    (void)dp_spec().run(ctx);
  } catch (const hr::Skipped& e) {
    skipped = e.what();
  }
  const auto pts = sweep_spec("DP-MEM").run(ctx);
  if (old) ::setenv("HEADROOM_MPIRUN", saved.c_str(), 1);
  else ::unsetenv("HEADROOM_MPIRUN");
  EXPECT_NE(skipped.find("mpirun"), std::string::npos) << skipped;
  ASSERT_EQ(pts.size(), 1u);
  EXPECT_EQ(pts[0].status, "skipped");
  EXPECT_FALSE(pts[0].reason.empty());
}

// With MPI: `headroom run`'s path end to end at two ranks (one seed), the
// measurements coming back through the worker's JSON.
TEST(DataParallel, LauncherRunsTwoRanks) {
  HR_TEST_DEVICE(dev, hr::BackendKind::cpu);
  const std::string why = hr::dist::dp_unavailable_reason();
  if (!why.empty()) GTEST_SKIP() << why;
  const auto saved = hr::dist::dp_rank_counts();
  hr::dist::set_dp_rank_counts({2});
  hr::RunContext ctx{dev};
  ctx.seed = 11;
  const auto ms = dp_spec().run(ctx);
  hr::dist::set_dp_rank_counts(saved);
  ASSERT_GE(ms.size(), 15u);
  size_t controls = 0;
  for (const Measurement& m : ms) {
    EXPECT_TRUE(hr::test::passed(m)) << hr::test::describe(m);
    EXPECT_EQ(m.config.value("ranks", 0), 2) << hr::test::describe(m) << m.config.dump();
    controls += m.negative_control ? 1 : 0;
  }
  EXPECT_GE(controls, 8u);
}

}  // namespace
