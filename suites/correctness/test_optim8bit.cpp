// The 8-bit optimizer state's parts: the dynamic maps (against an independent
// construction in the manner of bitsandbytes' create_dynamic_map), block-wise
// quantise/dequantise, the 8-bit AdamW op on each backend, the optimizer's
// 4096-element threshold and the step configuration's keys.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <vector>

#include "harness/check.hpp"
#include "harness/models/params.hpp"
#include "harness/step/optimizer.hpp"
#include "harness/step/step_config.hpp"
#include "kernels/optim/optim8.hpp"
#if HEADROOM_HAVE_CUDA
#include "kernels/optim/optim8_cuda.hpp"
#endif
#include "suites/common/test_support.hpp"

namespace {

using hr::Consumer;
using hr::DType;
using hr::Tensor;
using hr::q8::MapKind;

// bitsandbytes' construction, written out: per decade i (0..6) the midpoints of
// linspace(0.1, 1, k + 1) times 10^(i - 6), k = 2^i (signed, both signs) or 2^(i+1)
// (unsigned), then 0 and 1, sorted.
std::vector<double> reference_map(bool is_signed) {
  std::vector<double> v;
  for (int i = 0; i < 7; ++i) {
    const int k = is_signed ? (1 << i) : (2 << i);
    for (int j = 0; j < k; ++j) {
      const double lo = 0.1 + 0.9 * j / k, hi = 0.1 + 0.9 * (j + 1) / k;
      const double x = std::pow(10.0, i - 6) * (lo + hi) / 2;
      v.push_back(x);
      if (is_signed) v.push_back(-x);
    }
  }
  v.push_back(0.0);
  v.push_back(1.0);
  std::sort(v.begin(), v.end());
  return v;
}

TEST(Optim8bitCodebook, MatchesTheDynamicTreeMap) {
  for (const bool is_signed : {true, false}) {
    SCOPED_TRACE(is_signed ? "signed" : "unsigned");
    const std::vector<double> ref = reference_map(is_signed);
    ASSERT_EQ(ref.size(), 256u);
    const hr::q8::Codebook c = hr::q8::make_codebook(is_signed ? MapKind::dynamic_signed : MapKind::dynamic_unsigned);
    for (int i = 0; i < 256; ++i) EXPECT_NEAR(c.value[i], ref[static_cast<size_t>(i)], 1e-7 * std::fabs(ref[i])) << i;
    for (int i = 1; i < 256; ++i) EXPECT_LT(c.value[i - 1], c.value[i]) << i;  // strictly monotone
    EXPECT_EQ(std::count(c.value, c.value + 256, 0.f), 1);                     // exactly one zero
    EXPECT_EQ(c.value[255], 1.f);
    if (is_signed) {
      EXPECT_EQ(c.value[127], 0.f);
      EXPECT_FLOAT_EQ(c.value[0], -0.99296875f);  // 1 - 0.9 / 128: the lowest code is not -1
      EXPECT_EQ(std::count_if(c.value, c.value + 256, [](float x) { return x < 0.f; }), 127);
    } else {
      EXPECT_EQ(c.value[0], 0.f);
      EXPECT_FLOAT_EQ(c.value[1], 1e-6f * (0.1f + 0.225f));  // decade 0: two codes
    }
  }
}

TEST(Optim8bitCodebook, EncodesTheNearestCode) {
  const hr::q8::Codebook c = hr::q8::make_codebook(MapKind::dynamic_signed);
  for (int i = 0; i < 256; ++i) EXPECT_EQ(hr::q8::encode(c, c.value[i]), i);
  for (int i = 0; i + 1 < 256; ++i) {
    const float lo = c.value[i], hi = c.value[i + 1];
    EXPECT_EQ(hr::q8::encode(c, lo + 0.3f * (hi - lo)), i);
    EXPECT_EQ(hr::q8::encode(c, lo + 0.7f * (hi - lo)), i + 1);
  }
  EXPECT_EQ(hr::q8::encode(c, -1.f), 0);
  EXPECT_EQ(hr::q8::encode(c, 1.f), 255);
}

std::vector<float> random_values(size_t n, uint64_t seed, bool non_negative) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.f, 1.f);
  std::uniform_real_distribution<float> e(-5.f, 0.f);
  std::vector<float> v(n);
  for (float& x : v) {
    x = d(rng) * std::pow(10.f, e(rng));
    if (non_negative) x = x * x;
  }
  return v;
}

void check_round_trip(hr::Device& dev) {
  for (const int64_t block : {hr::q8::kDefaultBlock, hr::q8::kLargeBlock}) {
    for (const MapKind map : {MapKind::dynamic_signed, MapKind::dynamic_unsigned}) {
      const int64_t n = 3 * block + 17;  // a partial last block
      std::vector<float> x = random_values(static_cast<size_t>(n), 5 + block, map == MapKind::dynamic_unsigned);
      std::fill(x.begin() + block, x.begin() + 2 * block, 0.f);  // an all-zero block
      const Tensor t = Tensor::from_host(dev, x, {n}, DType::f32, Consumer::workspace);
      Tensor codes = Tensor::empty(dev, {n}, DType::u8, Consumer::workspace);
      Tensor absmax = Tensor::empty(dev, {hr::q8::block_count(n, block)}, DType::f32, Consumer::workspace);
      Tensor back = Tensor::empty(dev, {n}, DType::f32, Consumer::workspace);
      hr::ops::quantize_blockwise(t, codes, absmax, block, map);
      hr::ops::dequantize_blockwise(codes, absmax, back, block, map);
      const std::vector<float> a = absmax.to_host_f32(), y = back.to_host_f32();
      ASSERT_EQ(a.size(), 4u);
      EXPECT_EQ(a[1], 0.f);
      for (int b = 0; b < 4; ++b) {
        float m = 0.f;
        for (int64_t i = b * block; i < std::min(n, (b + 1) * block); ++i) m = std::max(m, std::fabs(x[i]));
        EXPECT_EQ(a[b], m) << "block " << b;  // absmax is exact
      }
      const hr::q8::Codebook c = hr::q8::make_codebook(map);
      for (int64_t i = 0; i < n; ++i) {
        const float am = a[static_cast<size_t>(i / block)];
        if (am == 0.f) {
          EXPECT_EQ(y[i], 0.f) << i;
          continue;
        }
        // The dequantised value is a code times absmax, and no code lies closer to x.
        const uint8_t q = codes.to_host_bytes()[static_cast<size_t>(i)];
        EXPECT_EQ(y[i], c.value[q] * am) << i;
        const float u = x[i] / am;
        if (q > 0) EXPECT_LE(std::fabs(u - c.value[q]), std::fabs(u - c.value[q - 1]) * (1 + 1e-6f)) << i;
        if (q < 255) EXPECT_LE(std::fabs(u - c.value[q]), std::fabs(u - c.value[q + 1]) * (1 + 1e-6f)) << i;
        if (i > 64) break;  // the per-element code read back is slow; Q8-1 covers every element
      }
    }
  }
}

TEST(Optim8bitQuantize, RoundTripCpu) {
  HR_TEST_DEVICE(dev, hr::BackendKind::cpu);
  check_round_trip(dev);
}
TEST(Optim8bitQuantize, RoundTripCuda) {
  HR_TEST_DEVICE(dev, hr::BackendKind::cuda);
  check_round_trip(dev);
}

// From a zero state, the first 8-bit step takes fp32 AdamW's step (the update uses
// the fp32 moments before they are encoded), and the encoded moments decode to
// within half a gap of fp32 AdamW's; a second step differs from fp32 by the
// quantisation of the first step's state only.
// Both steps are the same inline arithmetic; on a GPU the compiler may contract the
// two kernels' multiply-adds differently, so there they agree within 2 ulp of what
// was added: |p| plus lr per step taken (as in expect_follows_cpu below).
void expect_same_step(const Tensor& a, const Tensor& b, bool bitwise, float moved_by) {
  if (bitwise) {
    EXPECT_EQ(a.to_host_bytes(), b.to_host_bytes());
    return;
  }
  const std::vector<float> x = a.to_host_f32(), y = b.to_host_f32();
  const float ulp = a.dtype() == DType::f32 ? 0x1p-23f : 0x1p-7f;
  for (size_t i = 0; i < x.size(); ++i)
    EXPECT_LE(std::fabs(x[i] - y[i]), 2 * ulp * (std::fabs(x[i]) + moved_by)) << i;
}

void check_adamw8bit(hr::Device& dev, DType param_dtype) {
  const bool bitwise = !dev.is_cuda();
  const int64_t n = 5000;  // 20 blocks, the last partial
  const std::vector<float> p0 = random_values(static_cast<size_t>(n), 1, false);
  const hr::ops::AdamWConfig cfg{1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f};
  Tensor p8 = Tensor::from_host(dev, p0, {n}, param_dtype, Consumer::weights);
  Tensor p32 = Tensor::from_host(dev, p0, {n}, param_dtype, Consumer::weights);
  Tensor m = Tensor::zeros(dev, {n}, DType::f32, Consumer::optimizer_state);
  Tensor v = Tensor::zeros(dev, {n}, DType::f32, Consumer::optimizer_state);
  const int64_t blocks = hr::q8::block_count(n, 256);
  Tensor mq = Tensor::zeros(dev, {n}, DType::u8, Consumer::optimizer_state);
  Tensor vq = Tensor::zeros(dev, {n}, DType::u8, Consumer::optimizer_state);
  Tensor ma = Tensor::zeros(dev, {blocks}, DType::f32, Consumer::optimizer_state);
  Tensor va = Tensor::zeros(dev, {blocks}, DType::f32, Consumer::optimizer_state);
  const Tensor g = Tensor::from_host(dev, random_values(static_cast<size_t>(n), 2, false), {n}, DType::f32,
                                     Consumer::gradients);
  hr::ops::adamw_step(p32, g, m, v, 1, cfg);
  hr::ops::adamw8bit_step(p8, g, mq, ma, vq, va, 1, cfg);
  expect_same_step(p8, p32, bitwise, cfg.lr);  // the same arithmetic on the same values
  Tensor md = Tensor::empty(dev, {n}, DType::f32, Consumer::workspace);
  Tensor vd = Tensor::empty(dev, {n}, DType::f32, Consumer::workspace);
  hr::ops::dequantize_blockwise(mq, ma, md, 256, MapKind::dynamic_signed);
  hr::ops::dequantize_blockwise(vq, va, vd, 256, MapKind::dynamic_unsigned);
  const std::vector<float> m32 = m.to_host_f32(), v32 = v.to_host_f32(), m8 = md.to_host_f32(), v8 = vd.to_host_f32();
  const std::vector<float> mabs = ma.to_host_f32(), vabs = va.to_host_f32();
  for (int64_t i = 0; i < n; ++i) {
    const size_t b = static_cast<size_t>(i / 256);
    // The widest half-gap of either map is 0.9 / 128 / 2 of absmax (signed top decade).
    EXPECT_LE(std::fabs(m8[i] - m32[i]), 0.0071f * mabs[b]) << i;
    EXPECT_LE(std::fabs(v8[i] - v32[i]), 0.0071f * vabs[b]) << i;
  }
  // Step 2 from the decoded state equals fp32 AdamW from the decoded state.
  m.copy_from(md);
  v.copy_from(vd);
  hr::ops::adamw_step(p32, g, m, v, 2, cfg);
  hr::ops::adamw8bit_step(p8, g, mq, ma, vq, va, 2, cfg);
  expect_same_step(p8, p32, bitwise, 2 * cfg.lr);
  EXPECT_THROW(hr::ops::adamw8bit_step(p8, g, mq, ma, vq, va, 0, cfg), hr::InvalidArgument);
  hr::ops::AdamW8bitOptions wrong;
  wrong.block_size = 2048;  // absmax sized for 256
  EXPECT_THROW(hr::ops::adamw8bit_step(p8, g, mq, ma, vq, va, 3, cfg, wrong), hr::Error);
}

TEST(Optim8bitAdamW, TakesFp32StepsFromItsDecodedStateCpu) {
  HR_TEST_DEVICE(dev, hr::BackendKind::cpu);
  check_adamw8bit(dev, DType::f32);
  check_adamw8bit(dev, DType::bf16);
}
TEST(Optim8bitAdamW, TakesFp32StepsFromItsDecodedStateCuda) {
  HR_TEST_DEVICE(dev, hr::BackendKind::cuda);
  check_adamw8bit(dev, DType::f32);
  check_adamw8bit(dev, DType::bf16);
}

// The CUDA AdamW step has a tiled kernel (a power-of-two block of 8 to 2048,
// aligned tensors) and one thread block per quantisation block for the rest; each
// must follow the CPU's loops over three steps, at block sizes and layouts that
// take both: a tail that is not a whole 8 elements, a view one element in (not
// 16-byte aligned), blocks of 8 (no shuffle), 64 (several blocks per warp), 512 and
// 1024 (two and four warps through the barrier), 300 and 4096.
// The same arithmetic, but nvcc contracts multiply-adds into FMAs (the decay, both
// moments and p - step_size * m / denom, in the SASS for sm_90) where g++ for
// baseline x86-64 rounds each product. So a parameter agrees within 4 ulp of the
// sizes of what was added to it: |p| plus lr per step taken (the update's size:
// |m / denom| is about 1 with the same gradient each step). Relative to |p| alone,
// an update that nearly cancels p would turn the CPU's rounding of the update
// (~6e-11) into hundreds of ulp of the small result. Absmax agrees within 4 ulp,
// and a code may move to its neighbour where a moment lies within rounding of the
// midpoint of two codes.
// Returns the GPU's parameter, codes and absmax bytes after the three steps.
std::vector<std::vector<uint8_t>> expect_follows_cpu(hr::Device& gpu, hr::Device& cpu, int64_t block, int64_t offset,
                                                     DType param_dtype, DType grad_dtype) {
  SCOPED_TRACE(fmt::format("block {} offset {} param {} grad {}", block, offset, hr::dtype_name(param_dtype),
                           hr::dtype_name(grad_dtype)));
  const int64_t n = 3 * 2048 + 1003;  // several tiles, the last partial and not a multiple of 8
  const hr::ops::AdamWConfig cfg{1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f};
  hr::ops::AdamW8bitOptions opt;
  opt.block_size = block;
  const int64_t blocks = hr::q8::block_count(n, block);
  struct State {
    Tensor whole_p, p, g, mq, vq, ma, va;
  };
  auto make = [&](hr::Device& dev) {
    State s;
    // The same parameter values at any offset (the elements before them are filler).
    std::vector<float> values(static_cast<size_t>(offset), 0.5f);
    const std::vector<float> p0 = random_values(static_cast<size_t>(n), 11, false);
    values.insert(values.end(), p0.begin(), p0.end());
    s.whole_p = Tensor::from_host(dev, values, {n + offset}, param_dtype, Consumer::weights);
    s.p = s.whole_p.slice(offset, offset + n);
    s.g = Tensor::from_host(dev, random_values(static_cast<size_t>(n), 12, false), {n}, grad_dtype,
                            Consumer::gradients);
    s.mq = Tensor::zeros(dev, {n}, DType::u8, Consumer::optimizer_state);
    s.vq = Tensor::zeros(dev, {n}, DType::u8, Consumer::optimizer_state);
    s.ma = Tensor::zeros(dev, {blocks}, DType::f32, Consumer::optimizer_state);
    s.va = Tensor::zeros(dev, {blocks}, DType::f32, Consumer::optimizer_state);
    return s;
  };
  State a = make(gpu), b = make(cpu);
#if HEADROOM_HAVE_CUDA
  // Which kernel this comparison judges: the tiled one for an aligned power-of-two block.
  const bool pow2 = block >= 8 && block <= 2048 && (block & (block - 1)) == 0;
  EXPECT_EQ(hr::ops::cuda::adamw8bit_tiled(a.p, a.g, a.mq, a.vq, block), pow2 && offset == 0);
#endif
  for (int64_t step = 1; step <= 3; ++step) {
    hr::ops::adamw8bit_step(a.p, a.g, a.mq, a.ma, a.vq, a.va, step, cfg, opt);
    hr::ops::adamw8bit_step(b.p, b.g, b.mq, b.ma, b.vq, b.va, step, cfg, opt);
  }
  const float ulp = param_dtype == DType::f32 ? 0x1p-23f : 0x1p-7f;
  const std::vector<float> pa = a.p.to_host_f32(), pb = b.p.to_host_f32();
  const float moved_by = 3 * cfg.lr;  // three steps of about lr each
  int bad_p = 0;
  for (size_t i = 0; i < pa.size(); ++i) bad_p += std::fabs(pa[i] - pb[i]) > 4 * ulp * (std::fabs(pb[i]) + moved_by);
  EXPECT_EQ(bad_p, 0);
  for (const auto& [x, y] : {std::pair{&a.ma, &b.ma}, std::pair{&a.va, &b.va}}) {
    const std::vector<float> u = x->to_host_f32(), w = y->to_host_f32();
    int bad = 0;
    for (size_t i = 0; i < u.size(); ++i) bad += std::fabs(u[i] - w[i]) > 4 * 0x1p-23f * std::fabs(w[i]);
    EXPECT_EQ(bad, 0);
  }
  for (const auto& [x, y] : {std::pair{&a.mq, &b.mq}, std::pair{&a.vq, &b.vq}}) {
    const std::vector<uint8_t> u = x->to_host_bytes(), w = y->to_host_bytes();
    int moved = 0, far = 0;
    for (size_t i = 0; i < u.size(); ++i) {
      moved += u[i] != w[i];
      far += std::abs(int{u[i]} - int{w[i]}) > 1;
    }
    EXPECT_EQ(far, 0);
    EXPECT_LE(moved, n / 1000) << "codes that differ";
  }
  return std::vector<std::vector<uint8_t>>{a.p.to_host_bytes(), a.mq.to_host_bytes(), a.vq.to_host_bytes(),
                                           a.ma.to_host_bytes(), a.va.to_host_bytes()};
}

TEST(Optim8bitAdamW, BothCudaKernelsFollowTheCpuCuda) {
  HR_TEST_DEVICE(gpu, hr::BackendKind::cuda);
  HR_TEST_DEVICE(cpu, hr::BackendKind::cpu);
  for (const int64_t block : {int64_t{256}, int64_t{2048}, int64_t{8}, int64_t{64}, int64_t{512}, int64_t{1024},
                              int64_t{300}, int64_t{4096}}) {
    // Offset 1 takes the one-block-per-quantisation-block kernel on the same values:
    // the two kernels' elementwise arithmetic is the same code, so they agree bit for bit.
    // Blocks 300 and 4096 take that kernel at both offsets (checked against the CPU only).
    const auto tiled = expect_follows_cpu(gpu, cpu, block, 0, DType::f32, DType::f32);
    const auto fallback = expect_follows_cpu(gpu, cpu, block, 1, DType::f32, DType::f32);
    if (block != 300 && block != 4096) EXPECT_EQ(tiled, fallback) << "block " << block;
  }
  expect_follows_cpu(gpu, cpu, 256, 0, DType::bf16, DType::bf16);
  expect_follows_cpu(gpu, cpu, 2048, 0, DType::f32, DType::bf16);
  expect_follows_cpu(gpu, cpu, 2048, 0, DType::f16, DType::f32);
}

// 8-bit AdamW over two parameters: "big", just large enough for 8-bit state
// (4096 elements), and "small", one element short of it.
std::unique_ptr<hr::Optimizer> adamw8bit_over_big_and_small(hr::ParamSet& ps) {
  ps.add_normal("big", {4096}, 0.02f);
  ps.add_normal("small", {4095}, 0.02f);
  hr::OptimizerConfig oc;
  oc.kind = hr::OptimizerKind::adamw8bit;
  return hr::make_optimizer(oc, ps);
}

TEST(Optim8bitOptimizer, SmallTensorsKeepFp32State) {
  HR_TEST_DEVICE(dev, hr::BackendKind::cpu);
  hr::ParamSet ps(dev, hr::ParamStorage{}, 3);
  const auto o = adamw8bit_over_big_and_small(ps);
  std::vector<std::string> names;
  for (const auto& [name, t] : o->state()) names.push_back(name + ":" + hr::dtype_name(t.dtype()));
  EXPECT_EQ(names, (std::vector<std::string>{"big.exp_avg.codes:uint8", "big.exp_avg.absmax:fp32",
                                             "big.exp_avg_sq.codes:uint8", "big.exp_avg_sq.absmax:fp32",
                                             "small.exp_avg:fp32", "small.exp_avg_sq:fp32"}));
  EXPECT_EQ(o->state_bytes(), 2u * 4096 + 2 * 4 * 16 + 8u * 4095);
  EXPECT_EQ(o->state_bytes(), hr::adamw8bit_state_bytes(4096, 256) + hr::adamw8bit_state_bytes(4095, 256));
}

// A bad tensor in the fp32-state list (a small parameter's) refuses the whole step
// before the 8-bit list (the large ones) is stepped: nothing moves.
TEST(Optim8bitOptimizer, ABadSmallTensorRefusesTheStepBeforeTheLargeOnesMove) {
  HR_TEST_DEVICE(dev, hr::BackendKind::cpu);
  hr::ParamSet ps(dev, hr::ParamStorage{}, 5);
  const auto o = adamw8bit_over_big_and_small(ps);
  uint64_t seed = 50;
  for (hr::Param& p : ps.all())
    p.grad = hr::Tensor::from_host(dev, hr::test::random_nonzero(static_cast<size_t>(p.master.numel()), ++seed, -1e-2f, 1e-2f),
                                   p.master.shape(), hr::DType::f32, hr::Consumer::gradients);
  const auto big_before = ps.at("big").master.to_host_bytes();
  hr::Param& small = ps.at("small");
  const hr::Tensor good_grad = small.grad;
  small.grad = hr::Tensor::zeros(dev, {4094}, hr::DType::f32, hr::Consumer::gradients);  // the wrong shape
  EXPECT_THROW(o->step(ps, 1), hr::Error);
  EXPECT_EQ(ps.at("big").master.to_host_bytes(), big_before) << "the 8-bit tensor moved before the refusal";
  small.grad = good_grad;
  o->step(ps, 1);
  EXPECT_NE(ps.at("big").master.to_host_bytes(), big_before) << "the step after the fix moved nothing";
}

TEST(Optim8bitOptimizer, ConfigKeysRoundTrip) {
  hr::StepConfig c;
  c.optimizer.kind = hr::OptimizerKind::adamw8bit;
  c.optimizer.adamw8bit.block_size = 2048;
  c.optimizer.adamw.lr = 3e-4f;
  const nlohmann::json j = c;
  EXPECT_EQ(j["optimizer"]["kind"], "adamw8bit");
  EXPECT_EQ(j["optimizer"]["adamw8bit"]["block_size"], 2048);
  const hr::StepConfig back = hr::step_config_from_json(j);
  EXPECT_EQ(back.optimizer.kind, hr::OptimizerKind::adamw8bit);
  EXPECT_EQ(back.optimizer.adamw8bit.block_size, 2048);
  EXPECT_EQ(nlohmann::json(back), j);
  nlohmann::json bad = j;
  bad["optimizer"]["adamw8bit"]["blocksize"] = 256;
  EXPECT_THROW(hr::step_config_from_json(bad), hr::InvalidArgument);
  hr::StepConfig zero = back;
  zero.optimizer.adamw8bit.block_size = 0;
  EXPECT_THROW(hr::validate(zero), hr::InvalidArgument);
}

}  // namespace
