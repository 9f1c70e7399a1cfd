// Where the host waits for the device. A training step must not wait once per
// micro-batch: the ids, positions and targets it checks are read from the batch's
// host copies, and the micro-batches' losses come back in stream order and are read
// once, after the last one. Device::host_syncs counts every wait (copy_to_host,
// synchronize, a read-back that had not landed); these tests hold a step's count to
// the same small number with 1 and with 8 micro-batches, and show that the count
// sees one extra read per micro-batch. Also: the read-back copies in stream order,
// and LossValue sums what it read as the CPU sums.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "harness/data/synthetic.hpp"
#include "harness/faults.hpp"
#include "harness/loss_value.hpp"
#include "harness/step/train_step.hpp"
#include "kernels/crossentropy/crossentropy.hpp"
#include "suites/common/step_support.hpp"
#include "suites/common/test_support.hpp"

namespace {

using namespace hr;

// Waits a step may make whatever its micro-batch count: the loss scaler's one
// non-finite flag (16-bit steps with loss scaling) and the window's loss.
constexpr size_t kStepHostSyncs = 2;

struct SyncCase {
  ModelKind model;
  MlpTask task;
  DType dtype;
};

StepConfig config_of(const SyncCase& c, int64_t micro_batch) {
  StepConfig cfg = c.model == ModelKind::transformer ? test::tiny_transformer_config(c.dtype)
                                                     : test::tiny_mlp_config(c.dtype);
  cfg.mlp.task = c.task;
  cfg.batch = 8;
  cfg.micro_batch = micro_batch;
  return cfg;
}

Batch batch_of(Device& dev, const StepConfig& cfg) {
  return cfg.model == ModelKind::transformer ? make_lm_batch(dev, cfg.transformer, cfg.batch, cfg.seq_len, 5)
                                             : make_mlp_batch(dev, cfg.mlp, cfg.batch, 5);
}

// Host waits of one step after a warm-up step; `per_micro_batch_read` adds a read of
// one parameter at every micro-batch's forward/backward boundary (the control).
size_t step_syncs(Device& dev, const StepConfig& cfg, const Batch& batch, bool per_micro_batch_read = false) {
  TrainStep step(dev, cfg);
  step.step(batch);
  if (per_micro_batch_read)
    step.set_forward_end_hook([&step](int64_t) { (void)step.params().all().front().master.to_host_bytes(); });
  const size_t before = dev.host_syncs();
  const StepResult r = step.step(batch);
  const size_t syncs = dev.host_syncs() - before;
  EXPECT_TRUE(std::isfinite(r.loss));
  return syncs;
}

class StepHostSyncs : public testing::TestWithParam<BackendKind> {};

const std::vector<SyncCase> kCases = {
    {ModelKind::transformer, MlpTask::regression, DType::f32},
    {ModelKind::transformer, MlpTask::regression, DType::f16},
    {ModelKind::transformer, MlpTask::regression, DType::bf16},
    {ModelKind::mlp, MlpTask::classification, DType::f32},
    {ModelKind::mlp, MlpTask::regression, DType::f16},
};

TEST_P(StepHostSyncs, AsManyWithEightMicroBatchesAsWithOne) {
  HR_TEST_DEVICE(dev, GetParam());
  for (const SyncCase& c : kCases) {
    SCOPED_TRACE(testing::Message() << model_kind_name(c.model) << " " << mlp_task_name(c.task) << " "
                                    << dtype_name(c.dtype));
    const StepConfig one = config_of(c, 8), eight = config_of(c, 1);
    const Batch batch = batch_of(dev, one);
    const size_t s1 = step_syncs(dev, one, batch), s8 = step_syncs(dev, eight, batch);
    RecordProperty("syncs", testing::PrintToString(s8));
    // The CPU's read-backs have always landed: the counts are equal. On a GPU the
    // window's loss read counts only if the device still trails the host when it is
    // read, in either step: one apart at most. A wait per micro-batch is 7 more.
    if (dev.is_cuda())
      EXPECT_LE(s8, s1 + 1);
    else
      EXPECT_EQ(s8, s1);
    EXPECT_LE(s8, kStepHostSyncs);
  }
}

// The control: one read of a parameter per micro-batch shows as 7 more waits with 8
// micro-batches than with 1, on either backend.
TEST_P(StepHostSyncs, ControlOneReadPerMicroBatchIsCounted) {
  HR_TEST_DEVICE(dev, GetParam());
  const SyncCase c{ModelKind::transformer, MlpTask::regression, DType::f32};
  const StepConfig one = config_of(c, 8), eight = config_of(c, 1);
  const Batch batch = batch_of(dev, one);
  EXPECT_EQ(step_syncs(dev, eight, batch, true) - step_syncs(dev, one, batch, true), 7u);
}

// On a GPU a batch without host copies makes the ops read ids and targets from the
// device: waits per micro-batch, which the count sees. (The CPU reads them in place.)
TEST(StepHostSyncsCuda, ControlBatchWithoutHostCopiesWaitsPerMicroBatch) {
  HR_TEST_DEVICE(dev, BackendKind::cuda);
  const SyncCase c{ModelKind::transformer, MlpTask::regression, DType::f32};
  const StepConfig one = config_of(c, 8), eight = config_of(c, 1);
  Batch batch = batch_of(dev, one);
  batch.host.reset();
  EXPECT_GT(step_syncs(dev, eight, batch), step_syncs(dev, one, batch));
}

INSTANTIATE_TEST_SUITE_P(Step, StepHostSyncs, testing::Values(BackendKind::cpu, BackendKind::cuda),
                         test::backend_param_name);

// A CPU device whose read-backs land late, as a GPU's do when it trails the host:
// a read-back lands only when the host waits for it (or for the device). It runs
// in order: waiting for one read-back lands every older one too.
class LateReadbackDevice final : public Device {
 public:
  LateReadbackDevice() : Device(BackendKind::cpu) { record_.name = "CPU with late read-backs"; }
  void copy_on_device(void* dst, const void* src, size_t n) override { std::memmove(dst, src, n); }
  void fill_zero(void* dst, size_t n) override { std::memset(dst, 0, n); }
  std::unique_ptr<Timer> make_timer() override { return make_cpu_device()->make_timer(); }
  std::shared_ptr<HostReadback> read_back(const void* src, size_t n) override {
    auto r = std::make_shared<Late>(*this, std::vector<unsigned char>(static_cast<const unsigned char*>(src),
                                                                      static_cast<const unsigned char*>(src) + n));
    newest_ = r->sequence();
    return r;
  }

 protected:
  void do_copy_to_device(void* dst, const void* src, size_t n) override { std::memcpy(dst, src, n); }
  void do_copy_to_host(void* dst, const void* src, size_t n) override {
    std::memcpy(dst, src, n);
    landed_through_ = newest_;  // a plain read waits for the stream
  }
  void do_synchronize() override { landed_through_ = newest_; }
  void wait_for_newest_readback() override { landed_through_ = newest_; }
  void* raw_allocate(size_t bytes) override { return std::aligned_alloc(64, (bytes + 63) / 64 * 64); }
  void raw_free(void* p) noexcept override { std::free(p); }

 private:
  class Late final : public HostReadback {
   public:
    Late(LateReadbackDevice& dev, std::vector<unsigned char> bytes)
        : HostReadback(dev), dev_(dev), bytes_(std::move(bytes)) {}

   protected:
    bool landed() override { return sequence() <= dev_.landed_through_; }
    void block() override { dev_.landed_through_ = std::max(dev_.landed_through_, sequence()); }
    const void* bytes() const override { return bytes_.data(); }

   private:
    LateReadbackDevice& dev_;
    std::vector<unsigned char> bytes_;
  };
  uint64_t newest_ = 0, landed_through_ = 0;
};

// Host waits of a step of `cfg` on a device whose read-backs land late.
size_t late_step_syncs(const StepConfig& cfg) {
  LateReadbackDevice dev;
  const Batch batch = batch_of(dev, cfg);
  return step_syncs(dev, cfg, batch);
}

// With eight micro-batches' losses pending when the window's loss is read (oldest
// first), the host waits once for all of them, not once for each.
TEST(StepHostSyncsLate, OneWaitForAWindowsPendingLosses) {
  for (const SyncCase& c : kCases) {
    SCOPED_TRACE(testing::Message() << model_kind_name(c.model) << " " << mlp_task_name(c.task) << " "
                                    << dtype_name(c.dtype));
    const size_t s1 = late_step_syncs(config_of(c, 8)), s8 = late_step_syncs(config_of(c, 1));
    RecordProperty("syncs", testing::PrintToString(s8));
    EXPECT_EQ(s8, s1);
    EXPECT_LE(s8, kStepHostSyncs);
  }
}

// The control: a read that waits for its own read-back only (ReadbackFault) leaves
// the next one pending, and each of the other seven micro-batches' losses waits again.
TEST(StepHostSyncsLate, ControlWaitingForItsOwnReadBackOnlyCountsOnePerMicroBatch) {
  const SyncCase c{ModelKind::transformer, MlpTask::regression, DType::f32};
  const faults::Scoped<ReadbackFault> fault(ReadbackFault{true});
  EXPECT_EQ(late_step_syncs(config_of(c, 1)) - late_step_syncs(config_of(c, 8)), 7u);
}

// Read in any order, a set of pending read-backs costs one wait; a read-back that
// outlives its device returns its bytes.
TEST(ReadBackLate, AnyOrderOneWaitAndAReadBackMayOutliveItsDevice) {
  std::shared_ptr<Device::HostReadback> survivor;
  float kept = 0;
  {
    LateReadbackDevice dev;
    std::vector<std::shared_ptr<Device::HostReadback>> rs;
    std::vector<float> values = test::random_nonzero(6, 9);
    for (float& v : values) rs.push_back(dev.read_back(&v, sizeof v));
    const size_t before = dev.host_syncs();
    for (size_t i : {2u, 0u, 5u, 1u, 4u, 3u}) EXPECT_EQ(*static_cast<const float*>(rs[i]->wait()), values[i]);
    EXPECT_EQ(dev.host_syncs(), before + 1);
    kept = values[0];
    survivor = dev.read_back(&kept, sizeof kept);
  }
  EXPECT_EQ(*static_cast<const float*>(survivor->wait()), kept);
}

// The same on a GPU: the device waits for its stream when it goes, the read-back
// returns its bytes without it, and its pinned block goes back to the pool the two
// shared, freed with the read-back.
TEST(ReadBackCuda, AReadBackMayOutliveItsDevice) {
  HR_TEST_DEVICE(gpu, BackendKind::cuda);  // skips without a GPU
  (void)gpu;
  const std::vector<float> values = test::random_nonzero(257, 21);
  std::shared_ptr<Device::HostReadback> r;
  {
    const std::unique_ptr<Device> dev = make_cuda_device(0);
    Tensor t = Tensor::from_host(*dev, values, {257}, DType::f32, Consumer::workspace);
    r = dev->read_back(t.data(), t.nbytes());
  }
  const float* got = static_cast<const float*>(r->wait());
  EXPECT_EQ(std::vector<float>(got, got + values.size()), values);
  r.reset();
}

class ReadBack : public testing::TestWithParam<BackendKind> {};

// The copy is taken where it is enqueued: work queued after it (here, zeroing the
// source) does not change what it reads; a second wait does not wait again.
TEST_P(ReadBack, CopiesInStreamOrder) {
  HR_TEST_DEVICE(dev, GetParam());
  const std::vector<float> values = test::random_nonzero(1000, 17);
  Tensor t = Tensor::from_host(dev, values, {1000}, DType::f32, Consumer::workspace);
  const std::shared_ptr<Device::HostReadback> r = dev.read_back(t.data(), t.nbytes());
  t.zero_();
  const float* got = static_cast<const float*>(r->wait());
  EXPECT_EQ(std::vector<float>(got, got + values.size()), values);
  const size_t before = dev.host_syncs();
  r->wait();
  EXPECT_EQ(dev.host_syncs(), before);
  EXPECT_EQ(t.to_host_f32(), std::vector<float>(values.size(), 0.f));
  EXPECT_EQ(dev.host_syncs(), before + 1);  // a plain read waits, and is counted
}

// A pending loss is the items summed in double in index order times the weight, the
// CPU's arithmetic; the cross-entropy's loss is the same number pending or not.
TEST_P(ReadBack, PendingLossSumsAsTheCpuDoes) {
  HR_TEST_DEVICE(dev, GetParam());
  const std::vector<float> items = test::random_nonzero(777, 3);
  Tensor t = Tensor::from_host(dev, items, {777}, DType::f32, Consumer::workspace);
  const LossValue v = LossValue::pending_sum_of_floats(dev.read_back(t.data(), t.nbytes()), 777, 0.125);
  double expect = 0;
  for (float x : items) expect += x;
  EXPECT_TRUE(v.pending());
  EXPECT_EQ(v.value(), expect * 0.125);
  EXPECT_FALSE(v.pending());
  // No items (a micro-batch of zero rows): the sum is 0, nothing is read.
  EXPECT_EQ(LossValue::pending_sum_of_floats(dev.read_back(t.data(), 0), 0, 0.125).value(), 0.0);
}

INSTANTIATE_TEST_SUITE_P(Device, ReadBack, testing::Values(BackendKind::cpu, BackendKind::cuda),
                         test::backend_param_name);

}  // namespace
