// Many tensors stepped in one call (adamw_step_many, adamw8bit_step_many in
// kernels/optim) against each tensor stepped on its own: the same bytes of
// parameter and state after three steps, on every backend. On a GPU the first runs
// the many-tensor kernels (one group of more tensors than a launch takes, so it is split)
// and the second the per-tensor ones; the tensors a launch cannot take (unaligned
// views, a block that is not a power of two) go through the per-tensor path in both.
// A refused call changes nothing.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <tuple>
#include <vector>

#include "harness/check.hpp"
#include "harness/device.hpp"
#include "harness/registry.hpp"
#include "kernels/optim/optim.hpp"
#include "kernels/optim/optim8.hpp"
#if HEADROOM_HAVE_CUDA
#include "kernels/optim/optim8_cuda.hpp"
#include "kernels/optim/optim_cuda.hpp"
#endif
#include "suites/common/test_support.hpp"

namespace {

using hr::Consumer;
using hr::DType;
using hr::Tensor;

struct Spec {
  int64_t n;
  int64_t offset;  // elements before the view: 1 makes it unaligned
  DType param, grad;
  int64_t block;  // 8-bit state only
  float weight_decay;
};

// A view of n values at `offset` into a whole tensor (kept alive beside it).
struct View {
  Tensor whole, t;
};
View make_view(hr::Device& dev, const std::vector<float>& values, int64_t offset, DType dt, Consumer c) {
  std::vector<float> all(static_cast<size_t>(offset), 0.25f);
  all.insert(all.end(), values.begin(), values.end());
  View v;
  v.whole = Tensor::from_host(dev, all, {static_cast<int64_t>(all.size())}, dt, c);
  v.t = v.whole.slice(offset, offset + static_cast<int64_t>(values.size()));
  return v;
}

// Tensors of assorted sizes (an empty one, tails that are no whole pack or tile),
// dtypes, weight decays and alignments: most of them in one group of a launch
// (fp32 parameter and gradient, aligned), more than one launch takes, so that the
// group is split; the rest in groups of their own or on the per-tensor path.
std::vector<Spec> adamw_specs() {
  const int64_t sizes[] = {1, 7, 4096, 4097, 3 * 4096 + 5, 1003, 64, 20000, 0};
  std::vector<Spec> s;
  for (int i = 0; i < 90; ++i)
    s.push_back({sizes[i % 9], i % 11 == 3 ? 1 : 0, i % 8 == 5 ? DType::bf16 : DType::f32,
                 i % 10 == 7 ? DType::bf16 : DType::f32, 0, i % 2 ? 0.01f : 0.f});
  return s;
}

std::vector<Spec> adamw8bit_specs() {
  const int64_t sizes[] = {4096, 8192 + 8, 3 * 2048 + 1003, 5000, 4 * 4096, 2048, 0, 777};
  std::vector<Spec> s;
  for (int i = 0; i < 90; ++i) {
    const int64_t block = i % 9 == 4 ? 300 : i % 9 == 7 ? 2048 : i % 13 == 6 ? 64 : 256;
    const DType param = i % 8 == 5 ? DType::bf16 : i % 8 == 6 ? DType::f16 : DType::f32;
    s.push_back({sizes[i % 8], i % 11 == 3 ? 1 : 0, param, i % 10 == 7 ? DType::bf16 : DType::f32, block,
                 i % 2 ? 0.01f : 0.f});
  }
  return s;
}

// The most tensors of `specs` one launch group holds, grouped as the many-tensor
// steps group them: aligned views (and, for 8-bit state, a power-of-two block of 8
// to 2048) of one dtype pair and block size.
size_t largest_group(const std::vector<Spec>& specs, bool q8) {
  std::map<std::tuple<DType, DType, int64_t>, size_t> groups;
  size_t most = 0;
  for (const Spec& s : specs) {
    const bool pow2 = s.block >= 8 && s.block <= 2048 && (s.block & (s.block - 1)) == 0;
    if (s.offset != 0 || (q8 && !pow2)) continue;
    most = std::max(most, ++groups[{s.param, s.grad, q8 ? s.block : 0}]);
  }
  return most;
}

TEST(OptimManySpecs, OneGroupTakesMoreThanOneLaunch) {
#if HEADROOM_HAVE_CUDA
  EXPECT_GT(largest_group(adamw_specs(), false), static_cast<size_t>(hr::ops::cuda::adamw_tensors_per_launch()));
  EXPECT_GT(largest_group(adamw8bit_specs(), true),
            static_cast<size_t>(hr::ops::cuda::adamw8bit_tensors_per_launch()));
#else
  GTEST_SKIP() << "built without the CUDA backend: no launches to split";
#endif
}

class OptimMany : public testing::TestWithParam<hr::BackendKind> {};

struct AdamWState {
  View p, g, m, v;
};
AdamWState make_adamw(hr::Device& dev, const Spec& s, uint64_t seed) {
  const size_t n = static_cast<size_t>(s.n);
  AdamWState st;
  st.p = make_view(dev, hr::test::random_nonzero(n, seed), s.offset, s.param, Consumer::weights);
  st.g = make_view(dev, hr::test::random_nonzero(n, seed + 1), s.offset, s.grad, Consumer::gradients);
  st.m = make_view(dev, std::vector<float>(n, 0.f), s.offset, DType::f32, Consumer::optimizer_state);
  st.v = make_view(dev, std::vector<float>(n, 0.f), s.offset, DType::f32, Consumer::optimizer_state);
  return st;
}

TEST_P(OptimMany, AdamWStepsEachTensorAsItsOwnCallDoes) {
  HR_TEST_DEVICE(dev, GetParam());
  const std::vector<Spec> specs = adamw_specs();
  std::vector<AdamWState> many, one;
  for (size_t i = 0; i < specs.size(); ++i) {
    many.push_back(make_adamw(dev, specs[i], 100 + 2 * i));
    one.push_back(make_adamw(dev, specs[i], 100 + 2 * i));
  }
  auto cfg_of = [](const Spec& s) { return hr::ops::AdamWConfig{1e-3f, 0.9f, 0.999f, 1e-8f, s.weight_decay}; };
  for (int64_t step = 1; step <= 3; ++step) {
    std::vector<hr::ops::AdamWTensor> ts;
    for (size_t i = 0; i < specs.size(); ++i)
      ts.push_back({&many[i].p.t, &many[i].g.t, &many[i].m.t, &many[i].v.t, cfg_of(specs[i])});
    hr::ops::adamw_step_many(ts, step);
    for (size_t i = 0; i < specs.size(); ++i)
      hr::ops::adamw_step(one[i].p.t, one[i].g.t, one[i].m.t, one[i].v.t, step, cfg_of(specs[i]));
  }
  for (size_t i = 0; i < specs.size(); ++i) {
    SCOPED_TRACE(fmt::format("tensor {}: {} elements at offset {}, {} / {}", i, specs[i].n, specs[i].offset,
                             hr::dtype_name(specs[i].param), hr::dtype_name(specs[i].grad)));
    EXPECT_EQ(many[i].p.t.to_host_bytes(), one[i].p.t.to_host_bytes());
    EXPECT_EQ(many[i].m.t.to_host_bytes(), one[i].m.t.to_host_bytes());
    EXPECT_EQ(many[i].v.t.to_host_bytes(), one[i].v.t.to_host_bytes());
    if (specs[i].n > 0)
      EXPECT_NE(many[i].p.t.to_host_bytes(), make_adamw(dev, specs[i], 100 + 2 * i).p.t.to_host_bytes())
          << "the tensor was not stepped";
  }
}

struct Q8State {
  View p, g;
  Tensor mq, ma, vq, va;
};
Q8State make_q8(hr::Device& dev, const Spec& s, uint64_t seed) {
  const size_t n = static_cast<size_t>(s.n);
  Q8State st;
  st.p = make_view(dev, hr::test::random_nonzero(n, seed), s.offset, s.param, Consumer::weights);
  st.g = make_view(dev, hr::test::random_nonzero(n, seed + 1), s.offset, s.grad, Consumer::gradients);
  const int64_t blocks = hr::q8::block_count(s.n, s.block);
  st.mq = Tensor::zeros(dev, {s.n}, DType::u8, Consumer::optimizer_state);
  st.vq = Tensor::zeros(dev, {s.n}, DType::u8, Consumer::optimizer_state);
  st.ma = Tensor::zeros(dev, {blocks}, DType::f32, Consumer::optimizer_state);
  st.va = Tensor::zeros(dev, {blocks}, DType::f32, Consumer::optimizer_state);
  return st;
}

TEST_P(OptimMany, AdamW8bitStepsEachTensorAsItsOwnCallDoes) {
  HR_TEST_DEVICE(dev, GetParam());
  const std::vector<Spec> specs = adamw8bit_specs();
  std::vector<Q8State> many, one;
  for (size_t i = 0; i < specs.size(); ++i) {
    many.push_back(make_q8(dev, specs[i], 500 + 2 * i));
    one.push_back(make_q8(dev, specs[i], 500 + 2 * i));
  }
  auto cfg_of = [](const Spec& s) { return hr::ops::AdamWConfig{1e-3f, 0.9f, 0.999f, 1e-8f, s.weight_decay}; };
  auto opt_of = [](const Spec& s) {
    hr::ops::AdamW8bitOptions o;
    o.block_size = s.block;
    return o;
  };
  for (int64_t step = 1; step <= 3; ++step) {
    std::vector<hr::ops::AdamW8bitTensor> ts;
    for (size_t i = 0; i < specs.size(); ++i) {
      Q8State& a = many[i];
      ts.push_back({&a.p.t, &a.g.t, &a.mq, &a.ma, &a.vq, &a.va, cfg_of(specs[i]), opt_of(specs[i])});
    }
    hr::ops::adamw8bit_step_many(ts, step);
    for (size_t i = 0; i < specs.size(); ++i) {
      Q8State& b = one[i];
      hr::ops::adamw8bit_step(b.p.t, b.g.t, b.mq, b.ma, b.vq, b.va, step, cfg_of(specs[i]), opt_of(specs[i]));
    }
  }
#if HEADROOM_HAVE_CUDA
  // Which tensors the test means the many-tensor kernel to take is what it takes.
  for (size_t i = 0; i < specs.size(); ++i) {
    const bool pow2 = (specs[i].block & (specs[i].block - 1)) == 0 && specs[i].block <= 2048;
    if (dev.is_cuda())
      EXPECT_EQ(hr::ops::cuda::adamw8bit_tiled(many[i].p.t, many[i].g.t, many[i].mq, many[i].vq, specs[i].block),
                pow2 && specs[i].offset == 0)
          << "tensor " << i;
  }
#endif
  for (size_t i = 0; i < specs.size(); ++i) {
    SCOPED_TRACE(fmt::format("tensor {}: {} elements at offset {}, block {}, {} / {}", i, specs[i].n, specs[i].offset,
                             specs[i].block, hr::dtype_name(specs[i].param), hr::dtype_name(specs[i].grad)));
    EXPECT_EQ(many[i].p.t.to_host_bytes(), one[i].p.t.to_host_bytes());
    EXPECT_EQ(many[i].mq.to_host_bytes(), one[i].mq.to_host_bytes());
    EXPECT_EQ(many[i].vq.to_host_bytes(), one[i].vq.to_host_bytes());
    EXPECT_EQ(many[i].ma.to_host_bytes(), one[i].ma.to_host_bytes());
    EXPECT_EQ(many[i].va.to_host_bytes(), one[i].va.to_host_bytes());
    if (specs[i].n > 0)
      EXPECT_NE(many[i].p.t.to_host_bytes(), make_q8(dev, specs[i], 500 + 2 * i).p.t.to_host_bytes())
          << "the tensor was not stepped";
  }
}

// A bad tensor anywhere in the list refuses the call before any tensor is stepped.
TEST_P(OptimMany, ARefusedCallStepsNothing) {
  HR_TEST_DEVICE(dev, GetParam());
  const Spec good{4096, 0, DType::f32, DType::f32, 256, 0.01f};
  AdamWState a = make_adamw(dev, good, 7), bad = make_adamw(dev, good, 9);
  const auto before = a.p.t.to_host_bytes();
  Tensor v16 = Tensor::zeros(dev, {good.n}, DType::bf16, Consumer::optimizer_state);  // moments must be fp32
  const hr::ops::AdamWConfig cfg;
  EXPECT_THROW(hr::ops::adamw_step_many({{&a.p.t, &a.g.t, &a.m.t, &a.v.t, cfg}, {&bad.p.t, &bad.g.t, &bad.m.t, &v16, cfg}}, 1),
               hr::Error);
  EXPECT_EQ(a.p.t.to_host_bytes(), before);
  EXPECT_THROW(hr::ops::adamw_step_many({{&a.p.t, &a.g.t, &a.m.t, &a.v.t, cfg}}, 0), hr::InvalidArgument);
  EXPECT_EQ(a.p.t.to_host_bytes(), before);
  // A parameter listed twice: one launch would step it twice at once.
  EXPECT_THROW(hr::ops::adamw_step_many({{&a.p.t, &a.g.t, &a.m.t, &a.v.t, cfg}, {&a.p.t, &a.g.t, &a.m.t, &a.v.t, cfg}}, 1),
               hr::InvalidArgument);
  EXPECT_EQ(a.p.t.to_host_bytes(), before);

  Q8State q = make_q8(dev, good, 11), r = make_q8(dev, good, 13);
  const auto q_before = q.p.t.to_host_bytes();
  hr::ops::AdamW8bitOptions opt;
  hr::ops::AdamW8bitOptions wrong = opt;
  wrong.block_size = 512;  // r's absmax holds 256-element blocks
  EXPECT_THROW(hr::ops::adamw8bit_step_many({{&q.p.t, &q.g.t, &q.mq, &q.ma, &q.vq, &q.va, cfg, opt},
                                             {&r.p.t, &r.g.t, &r.mq, &r.ma, &r.vq, &r.va, cfg, wrong}},
                                            1),
               hr::Error);
  EXPECT_EQ(q.p.t.to_host_bytes(), q_before);
  EXPECT_EQ(q.mq.to_host_bytes(), std::vector<uint8_t>(static_cast<size_t>(good.n), 0));
  EXPECT_THROW(hr::ops::adamw8bit_step_many({{&q.p.t, &q.g.t, &q.mq, &q.ma, &q.vq, &q.va, cfg, opt},
                                             {&q.p.t, &q.g.t, &q.mq, &q.ma, &q.vq, &q.va, cfg, opt}},
                                            1),
               hr::InvalidArgument);
  EXPECT_EQ(q.p.t.to_host_bytes(), q_before);
}

// BM-OPT's bytes moved, counted independently: fp32 AdamW on fp32 parameters moves
// 28 bytes a parameter (parameter read and written, gradient read, two fp32
// moments read and written); 8-bit AdamW 12 a parameter and its state read and
// written. Their rate is over the step's median time.
TEST(OptimizerSweep, CountsTheBytesEachStepMoves) {
  auto dev = hr::make_device("cpu");
  const auto& sweeps = hr::sweep_registry();
  const auto spec = std::find_if(sweeps.begin(), sweeps.end(), [](const hr::SweepSpec& s) { return s.id == "BM-OPT"; });
  ASSERT_NE(spec, sweeps.end());
  hr::RunContext ctx{*dev, hr::Preset::quick, 1234, {}};
  const std::vector<hr::SweepPoint> points = spec->run(ctx);
  ASSERT_EQ(points.size(), 3u);
  for (const hr::SweepPoint& p : points) {
    ASSERT_EQ(p.status, "ok") << p.reason;
    const double params = p.metrics.at("parameters").get<double>();
    const double moved = p.metrics.at("bytes_moved").get<double>();
    if (p.config.at("optimizer") == "adamw")
      EXPECT_EQ(moved, 28.0 * params);
    else
      EXPECT_EQ(moved, 12.0 * params + 2.0 * p.metrics.at("state_bytes").get<double>());
    EXPECT_LT(moved, 28.0 * params + 1.0) << "8-bit state moves fewer bytes than fp32's";
    EXPECT_DOUBLE_EQ(p.metrics.at("bytes_per_s").get<double>(), moved / p.time->median_s);
  }
}

INSTANTIATE_TEST_SUITE_P(, OptimMany, testing::Values(hr::BackendKind::cpu, hr::BackendKind::cuda),
                         hr::test::backend_param_name);

}  // namespace
