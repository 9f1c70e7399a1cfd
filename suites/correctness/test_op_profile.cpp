// Device time by op (harness/op_profile.hpp): what a profile records, how nested
// ops count, that nothing is recorded without one, and time_region's profiled run
// under HEADROOM_OP_PROFILE with its round trip through results.json. On the CPU
// (a steady clock per op); the GPU's events are the same code behind Device::Timer.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cstdlib>
#include <map>
#include <memory>
#include <string>

#include "harness/check.hpp"
#include "harness/device.hpp"
#include "harness/op_profile.hpp"
#include "harness/properties/sweep_support.hpp"
#include "harness/results/results.hpp"
#include "harness/tensor.hpp"
#include "harness/timing.hpp"
#include "kernels/attention/attention.hpp"
#include "kernels/elementwise/elementwise.hpp"
#include "kernels/matmul/matmul.hpp"
#include "suites/common/test_support.hpp"

namespace {

using hr::Consumer;
using hr::DType;
using hr::Tensor;

Tensor random(hr::Device& dev, hr::Shape shape, uint64_t seed) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return Tensor::from_host(dev, hr::test::random_nonzero(static_cast<size_t>(n), seed), shape, DType::f32,
                           Consumer::workspace);
}

// Sets an environment variable for a scope and puts the previous value back.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* v = std::getenv(name)) before_ = v, had_ = true;
    setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (had_) setenv(name_, before_.c_str(), 1);
    else unsetenv(name_);
  }

 private:
  const char* name_;
  std::string before_;
  bool had_ = false;
};

// Each outermost op is recorded once per call under its own name; naive attention's
// products and softmax count as attention, not as gemm or softmax.
TEST(OpProfile, RecordsEachOutermostOpUnderItsName) {
  auto dev = hr::make_cpu_device();
  const Tensor a = random(*dev, {64, 48}, 1), b = random(*dev, {48, 32}, 2);
  Tensor c = Tensor::empty(*dev, {64, 32}, DType::f32, Consumer::workspace);
  const Tensor q = random(*dev, {1, 2, 16, 8}, 3), k = random(*dev, {1, 2, 16, 8}, 4), v = random(*dev, {1, 2, 16, 8}, 5);
  Tensor out = Tensor::empty(*dev, {1, 2, 16, 8}, DType::f32, Consumer::workspace);
  hr::ops::AttentionSaved saved;
  hr::OpProfile profile;
  EXPECT_TRUE(hr::OpProfile::active());
  hr::ops::matmul(a, false, b, false, c);
  hr::ops::matmul(a, false, b, false, c);
  hr::ops::scale(c, 0.5f, c);
  hr::ops::attention_forward(hr::ops::AttentionImpl::naive, q, k, v, hr::ops::AttnMask{}, 0.25f, out, saved,
                             Consumer::activations);
  const std::map<std::string, double> seconds = profile.take();
  EXPECT_EQ(profile.calls(), (std::map<std::string, size_t>{{"attention_forward", 1}, {"matmul", 2}, {"scale", 1}}));
  ASSERT_EQ(seconds.size(), 3u);
  for (const auto& [op, s] : seconds) EXPECT_GT(s, 0.0) << op;
  // take() empties the regions: a second take has only what ran since.
  hr::ops::scale(c, 2.f, c);
  EXPECT_EQ(profile.take().size(), 1u);
  EXPECT_EQ(profile.calls().at("scale"), 2u);
}

// Without an active profile an op records nothing; one profile to a thread; after a
// profile ends, ops are not recorded into it or into the next.
TEST(OpProfile, NothingIsRecordedWithoutAProfileAndOneToAThread) {
  auto dev = hr::make_cpu_device();
  Tensor x = random(*dev, {1000}, 7);
  EXPECT_FALSE(hr::OpProfile::active());
  hr::ops::scale(x, 2.f, x);
  {
    hr::OpProfile first;
    EXPECT_THROW({ hr::OpProfile second; }, hr::InvalidArgument);
    EXPECT_TRUE(hr::OpProfile::active());
    EXPECT_TRUE(first.take().empty());
  }
  EXPECT_FALSE(hr::OpProfile::active());
  hr::ops::scale(x, 2.f, x);
  hr::OpProfile next;
  EXPECT_TRUE(next.take().empty());
  hr::ops::scale(x, 2.f, x);
  EXPECT_EQ(next.take().size(), 1u);
  {  // an op still open: its region is not there to take
    const hr::OpTimer open(*dev, "open_op");
    EXPECT_THROW(next.take(), hr::Error);
  }
  EXPECT_EQ(next.take().size(), 1u);
}

// An op still open when its profile ends closes without touching the next one.
TEST(OpProfile, AnOpOutlivingItsProfileLeavesTheNextAlone) {
  auto dev = hr::make_cpu_device();
  Tensor x = random(*dev, {1000}, 7);
  std::unique_ptr<hr::OpTimer> stale;
  {
    hr::OpProfile gone;
    stale = std::make_unique<hr::OpTimer>(*dev, "stale");
  }
  hr::OpProfile next;
  stale.reset();
  hr::ops::scale(x, 2.f, x);
  std::map<std::string, double> seconds;
  EXPECT_NO_THROW(seconds = next.take());
  EXPECT_EQ(seconds.size(), 1u);
  EXPECT_EQ(next.calls(), (std::map<std::string, size_t>{{"scale", 1}}));
}

// time_region profiles one more run of its region when HEADROOM_OP_PROFILE=1 and
// keeps its samples as they are; results.json carries the seconds and reads them
// back, refusing a negative one.
TEST(OpProfile, TimeRegionProfilesOneMoreRunWhenAsked) {
  auto dev = hr::make_cpu_device();
  const Tensor a = random(*dev, {64, 64}, 1), b = random(*dev, {64, 64}, 2);
  Tensor c = Tensor::empty(*dev, {64, 64}, DType::f32, Consumer::workspace);
  int runs = 0;
  auto region = [&] {
    ++runs;
    hr::ops::matmul(a, false, b, false, c);
    hr::ops::add_bias(c, random(*dev, {64}, 3));
  };
  hr::TimingOptions opt;
  opt.warmup = 1;
  opt.min_reps = opt.max_reps = 3;
  const hr::props::OneBlasThread one_blas_thread(*dev);
  {
    const ScopedEnv off(hr::kOpProfileEnv, "0");
    const hr::TimeStats plain = hr::time_region(*dev, region, opt);
    EXPECT_TRUE(plain.op_seconds.empty());
    EXPECT_EQ(plain.extra_runs, 0);
    EXPECT_EQ(runs, 4);
  }
  runs = 0;
  const ScopedEnv on(hr::kOpProfileEnv, "1");
  const hr::TimeStats t = hr::time_region(*dev, region, opt);
  EXPECT_EQ(runs, 5);  // warm-up, three timed, one profiled
  EXPECT_EQ(t.extra_runs, 1);
  EXPECT_EQ(t.samples_s.size(), 3u);
  ASSERT_EQ(t.op_seconds.size(), 2u);
  EXPECT_GT(t.op_seconds.at("matmul"), 0.0);
  EXPECT_GT(t.op_seconds.at("add_bias"), 0.0);

  hr::Results r;
  r.preset = "quick";
  r.backend = "cpu";
  hr::SweepPoint p;
  p.sweep = "BM-MB";
  p.backend = "cpu";
  p.status = "ok";
  p.time = t;
  r.sweep_points.push_back(p);
  hr::compute_totals(r);
  nlohmann::json j = hr::results_to_json(r);
  EXPECT_EQ(j["sweep_points"][0]["time"]["op_seconds"]["matmul"].get<double>(), t.op_seconds.at("matmul"));
  const hr::Results back = hr::results_from_json(j);
  EXPECT_EQ(back.sweep_points.at(0).time->op_seconds, t.op_seconds);
  j["sweep_points"][0]["time"]["op_seconds"]["matmul"] = -1.0;
  EXPECT_THROW(hr::results_from_json(j), hr::InvalidArgument);
}

}  // namespace
