// Data parallelism within one process: the communicator's byte counting, the DP
// properties on the single-process communicator (N = 1: the checks hold; the
// controls need N > 1 and run under mpirun, ctest label mpi), NCCL with one rank on
// a GPU (skipped with the reason elsewhere), and the launcher `headroom run` uses:
// a skip with its reason when mpirun is absent, two real ranks when it is present.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <limits>
#include <map>
#include <set>
#include <stdexcept>
#include <utility>
#include <vector>

#include "harness/check.hpp"
#include "harness/dist/communicator.hpp"
#include "harness/dist/dp_step.hpp"
#include "harness/dist/launch.hpp"
#include "harness/dist/nccl_communicator.hpp"
#include "harness/properties/accum_support.hpp"
#include "harness/properties/data_parallel.hpp"
#include "harness/step/memory_model.hpp"
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

// The buckets: every gradient in exactly one, as a view (the gradients' bytes are
// the model's, once), filled in the order the backward finishes the blocks (the
// memory model's layout: the last block first, the parameters outside the blocks last).
TEST(DataParallel, BucketsHoldEveryGradientOnceInBackwardOrder) {
  HR_TEST_DEVICE(dev, hr::BackendKind::cpu);
  auto comm = hr::dist::make_single_communicator();
  const hr::StepConfig cfg = hr::props::accum_transformer_config(hr::DType::f32, 4, hr::Preset::quick);
  const std::vector<int64_t> sizes = hr::trainable_tensor_sizes(cfg), blocks = hr::parameter_tensor_blocks(cfg);
  int64_t elements = 0;
  for (int64_t n : sizes) elements += n;
  for (int64_t cap : {int64_t{0}, elements, elements / 3}) {
    SCOPED_TRACE(cap);
    hr::dist::DpOptions o;
    o.bucket_bytes = cap;
    dev.memory().reset_peak();
    const size_t before = dev.memory().snapshot().current(hr::Consumer::gradients);
    hr::dist::DataParallelStep dp(dev, *comm, cfg, hr::dist::DpSync::once_per_window, hr::dist::DpFault::none, o);
    EXPECT_EQ(dev.memory().snapshot().current(hr::Consumer::gradients) - before, static_cast<size_t>(elements) * 4);
    // Not twice: the step's own gradient tensors go before the buckets come.
    EXPECT_EQ(dev.memory().snapshot().peak(hr::Consumer::gradients) - before, static_cast<size_t>(elements) * 4);
    const auto buckets = dp.bucket_parameters();
    if (cap == 0) EXPECT_EQ(buckets.size(), 1u);
    if (cap == elements / 3) EXPECT_GE(buckets.size(), 3u);
    std::map<std::string, int64_t> block_of;
    const auto names = dp.local().gradients();
    ASSERT_EQ(names.size(), blocks.size());
    for (size_t i = 0; i < names.size(); ++i) block_of[names[i].first] = blocks[i];
    std::set<std::string> seen;
    int64_t last = std::numeric_limits<int64_t>::max();
    for (const auto& b : buckets)
      for (const std::string& n : b) {
        EXPECT_TRUE(seen.insert(n).second) << n << " in two buckets";
        const int64_t blk = block_of.at(n) < 0 ? -1 : block_of.at(n);
        EXPECT_LE(blk, last) << n << ": a block before one the backward finishes later";
        last = blk;
      }
    EXPECT_EQ(seen.size(), names.size());
  }
}

// At one rank the all-reduce is the identity: bucketed and overlapped gradients equal
// one bucket after the backward bitwise, every bucket of block gradients goes from a
// block's hook, and the overlap's faults move them (the controls' switches).
TEST(DataParallel, OverlappedBucketsEqualOneBucketAfterTheBackward) {
  HR_TEST_DEVICE(dev, hr::BackendKind::cpu);
  auto comm = hr::dist::make_single_communicator();
  const hr::StepConfig cfg = hr::props::accum_transformer_config(hr::DType::f32, 4, hr::Preset::quick);
  const hr::Batch batch = hr::props::accum_batch(dev, cfg, 11);
  auto run = [&](int64_t cap, bool overlap, hr::dist::DpFault fault, hr::dist::DpWindow* w = nullptr) {
    hr::dist::DpOptions o;
    o.bucket_bytes = cap;
    o.overlap = overlap;
    hr::dist::DataParallelStep dp(dev, *comm, cfg, hr::dist::DpSync::once_per_window, fault, o);
    const hr::dist::DpWindow got = dp.reduce_gradients(batch);
    if (w) *w = got;
    return hr::props::gradient_values(dp.local());
  };
  int64_t elements = 0;
  for (int64_t n : hr::trainable_tensor_sizes(cfg)) elements += n;
  hr::dist::DpWindow one, many, late;
  const auto a = run(0, false, hr::dist::DpFault::none, &one);
  const auto b = run(elements, true, hr::dist::DpFault::none, &many);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i].second, b[i].second) << a[i].first;
  EXPECT_EQ(one.all_reduces, 1);
  EXPECT_EQ(one.before_backward_end, 0);
  EXPECT_GE(many.all_reduces, 4);
  EXPECT_GE(many.before_backward_end, 2);
  EXPECT_LT(many.before_backward_end, many.all_reduces);  // the embeddings' bucket waits for the end
  (void)run(elements, true, hr::dist::DpFault::reduce_after_backward, &late);
  EXPECT_EQ(late.before_backward_end, 0);
  (void)run(elements, true, hr::dist::DpFault::last_block_bucket_late, &late);
  EXPECT_EQ(late.before_backward_end, many.before_backward_end - 1);
}

// Two ranks as NCCL's stream makes them look to the step: a deferred all-reduce lands
// at join() or at the next plain one (which follows it on the same stream), a plain
// one at once. A deferred buffer is the collective's until it lands: one written in
// between is an error (on a GPU, a race). The other rank holds v + 1 for every value
// v, so each all-reduce makes 2v + 1 (no scaling commutes with it).
class TwinCommunicator final : public hr::dist::Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 2; }
  std::string engine() const override { return "twin"; }
  bool device_buffers() const override { return false; }
  void join() override {
    std::vector<Pending> landing;
    landing.swap(pending_);
    for (Pending& d : landing) {
      if (!std::equal(d.sent.begin(), d.sent.end(), d.buf))
        throw std::logic_error("a deferred all-reduce's buffer was written before it landed");
      land(d.buf, d.sent.size());
    }
  }

 protected:
  void do_all_reduce_sum(void* buf, size_t count, hr::dist::CommDType t) override {
    join();
    land(f32(buf, t), count);
  }
  void do_all_reduce_sum_deferred(void* buf, size_t count, hr::dist::CommDType t) override {
    float* p = f32(buf, t);
    pending_.push_back({p, std::vector<float>(p, p + count)});
  }
  void do_all_gather(const void*, void*, size_t, hr::dist::CommDType) override { unused(); }
  void do_reduce_scatter_sum(const void*, void*, size_t, hr::dist::CommDType) override { unused(); }
  void do_broadcast(void*, size_t, int) override { unused(); }
  void do_barrier() override {}

 private:
  struct Pending {
    float* buf;
    std::vector<float> sent;  // what the collective read when it was launched
  };
  static float* f32(void* buf, hr::dist::CommDType t) {
    HR_CHECK(t == hr::dist::CommDType::f32, "the twin sums fp32 only");
    return static_cast<float*>(buf);
  }
  static void land(float* p, size_t n) {
    for (size_t i = 0; i < n; ++i) p[i] = 2 * p[i] + 1;
  }
  [[noreturn]] static void unused() { throw std::logic_error("the data-parallel step all-reduces only"); }
  std::vector<Pending> pending_;
};

// The buckets launched from the block hooks are deferred (on a GPU they run beside
// the rest of the backward) and nothing writes them until they land: the gradients
// equal the step that reduces every bucket after the backward, bit for bit. Control:
// a bucket spanning two blocks deferred once its first block is done
// (DpFault::deferred_before_ready) is written by the other block's backward, and seen.
TEST(DataParallel, DeferredBucketsAreLeftAloneUntilTheyLand) {
  HR_TEST_DEVICE(dev, hr::BackendKind::cpu);
  const hr::StepConfig cfg = hr::props::accum_transformer_config(hr::DType::f32, 4, hr::Preset::quick);
  const hr::Batch batch = hr::props::accum_batch(dev, cfg, 11);
  int64_t elements = 0;
  for (int64_t n : hr::trainable_tensor_sizes(cfg)) elements += n;
  auto run = [&](bool overlap, hr::dist::DpFault fault, hr::dist::DpWindow& w) {
    TwinCommunicator twin;
    hr::dist::DpOptions o;
    o.bucket_bytes = elements;  // about a quarter of the gradients' bytes: several buckets, some spanning two blocks
    o.overlap = overlap;
    hr::dist::DataParallelStep dp(dev, twin, cfg, hr::dist::DpSync::once_per_window, fault, o);
    w = dp.reduce_gradients(batch);
    return hr::props::gradient_values(dp.local());
  };
  hr::dist::DpWindow after, overlapped, early;
  const auto want = run(false, hr::dist::DpFault::none, after);
  const auto got = run(true, hr::dist::DpFault::none, overlapped);
  EXPECT_EQ(after.deferred, 0);
  EXPECT_GE(overlapped.deferred, 2);
  EXPECT_EQ(overlapped.deferred, overlapped.before_backward_end);
  ASSERT_EQ(want.size(), got.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(want[i].second, got[i].second) << want[i].first;
  EXPECT_THROW(run(true, hr::dist::DpFault::deferred_before_ready, early), std::logic_error);
}

TEST(DataParallel, RefusesWhatItCannotRun) {
  HR_TEST_DEVICE(dev, hr::BackendKind::cpu);
  auto comm = hr::dist::make_single_communicator();
  const hr::StepConfig cfg = hr::props::accum_mlp_config(hr::DType::f32, 4, hr::Preset::quick);
  hr::dist::DpOptions o;
  o.bucket_bytes = -1;
  EXPECT_THROW(hr::dist::DataParallelStep(dev, *comm, cfg, hr::dist::DpSync::once_per_window, hr::dist::DpFault::none, o),
               hr::InvalidArgument);
  o = {};
  o.overlap = false;
  EXPECT_THROW(hr::dist::DataParallelStep(dev, *comm, cfg, hr::dist::DpSync::once_per_window,
                                          hr::dist::DpFault::last_block_bucket_late, o),
               hr::InvalidArgument);
  hr::StepConfig sharded = cfg;
  sharded.sharding = hr::Sharding::zero2;
  EXPECT_THROW(hr::dist::DataParallelStep(dev, *comm, sharded, hr::dist::DpSync::once_per_window), hr::InvalidArgument);
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
