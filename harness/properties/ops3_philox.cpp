// OPS-3: the shared Philox4x32-10 is the stream cuRAND draws. Checked three ways:
// the round function against Random123's published known-answer vector (always);
// the host stream against cuRAND's host generator, which needs no GPU (builds with
// CUDA); and on a GPU, the device's draws against the host's, bit for bit. A gross
// negative control (counters without cuRAND's 65536-thread order) must mismatch,
// and each comparison also sees the smallest fault there is: one bit flipped in
// one word (a subtle control through the same comparison). The controls are
// switches of the stream (PhiloxFault, kernels/common/philox_host.hpp): the host's,
// and on a GPU the device kernel's (philox_fill.cu reads the same switch).
#include <fmt/format.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "harness/check.hpp"
#include "harness/registry.hpp"
#include "harness/tolerances.hpp"
#include "kernels/common/philox.hpp"
#include "kernels/common/philox_host.hpp"

#if HEADROOM_HAVE_CUDA
#include <curand.h>

#include "harness/properties/philox_fill_cuda.hpp"
#endif

namespace hr {
namespace {

constexpr const char* kId = "OPS-3";
// Bitwise: one stream on both sides, so any mismatching draw is a bug.
constexpr const char* kBitwiseReason =
    "docs/catalogue.md OPS-3: bit-identical streams, zero mismatching draws (tolerances.hpp kBitwiseMismatches)";

// The word (of `n`) and the bit a subtle control flips, chosen by the run's seed.
struct BitFlip {
  size_t index;
  uint32_t mask;
};
BitFlip bit_flip(uint64_t seed, size_t n) {
  return {static_cast<size_t>((seed * 0x9e3779b97f4a7c15ull) >> 7) % n, 1u << (seed % 32)};
}

Measurement bitwise(const std::string& title, const std::string& backend, size_t mismatches, size_t compared,
                    nlohmann::json details) {
  Measurement m = make_check(kId, title, static_cast<double>(mismatches), tol::kBitwiseMismatches);
  m.backend = backend;
  m.dtype = "uint32";
  m.model = "op:philox";
  m.metric = "bitwise_mismatches";
  m.tolerance_reason = kBitwiseReason;
  details["draws_compared"] = compared;
  m.details = std::move(details);
  return m;
}

// A subtle control of a bitwise comparison: `mismatches` counted by the same
// comparison on data with one bit flipped in one word.
Measurement one_bit_control(const std::string& what, const std::string& backend, size_t mismatches,
                            size_t compared, const BitFlip& flip, nlohmann::json config, const std::string& of) {
  Measurement m = make_subtle_control(kId, what + " with one bit flipped in one word is caught",
                                      static_cast<double>(mismatches), tol::kBitwiseMismatches, check_name(kId, of));
  m.backend = backend;
  m.dtype = "uint32";
  m.model = "op:philox";
  m.metric = "bitwise_mismatches";
  m.tolerance_reason = kBitwiseReason;
  m.config = std::move(config);
  // Which word and bit are drawn from the seed: the details, not the config (the key).
  m.config["broken"] = "one bit of one word";
  m.details = nlohmann::json{{"draws_compared", compared},
                             {"flipped", fmt::format("word {} xor {:#010x}", flip.index, flip.mask)}};
  return m;
}

// Random123's known-answer vector for philox4x32_10 (kat_vectors, the pi digits
// counter and key): checks the round function itself; and the same comparison
// with one bit of the output flipped.
std::vector<Measurement> known_answer(uint64_t seed) {
  auto round = [] {
    return philox4x32_10_host(Philox4{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}, 0xa4093822u, 0x299f31d0u);
  };
  const Philox4 r = round();
  const uint32_t want[4] = {0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u};
  auto mismatches = [&](const uint32_t* got) {
    size_t bad = 0;
    for (int i = 0; i < 4; ++i) bad += got[i] != want[i];
    return bad;
  };
  uint32_t got[4] = {r.x, r.y, r.z, r.w};
  const nlohmann::json cfg{{"check", "known_answer"}};
  Measurement m = bitwise("Philox4x32-10 round function matches Random123's known-answer vector", "cpu",
                          mismatches(got), 4, nlohmann::json{{"source", "Random123 kat_vectors philox4x32_10"}});
  m.config = cfg;
  const BitFlip flip = bit_flip(seed, 4);
  Philox4 broken{};
  {
    ScopedPhiloxFault fault({false, static_cast<int64_t>(flip.index), flip.mask});
    broken = round();
  }
  const uint32_t bad[4] = {broken.x, broken.y, broken.z, broken.w};
  return {m, one_bit_control("the round function's output", "cpu", mismatches(bad), 4, flip, cfg, m.title)};
}

#if HEADROOM_HAVE_CUDA

class CurandHost {
 public:
  CurandHost() {
    const curandStatus_t s = curandCreateGeneratorHost(&g_, CURAND_RNG_PSEUDO_PHILOX4_32_10);
    HR_CHECK(s == CURAND_STATUS_SUCCESS, "curandCreateGeneratorHost(PHILOX4_32_10) returned {}", static_cast<int>(s));
  }
  ~CurandHost() { curandDestroyGenerator(g_); }
  CurandHost(const CurandHost&) = delete;
  CurandHost& operator=(const CurandHost&) = delete;

  void draw(uint64_t seed, uint64_t offset, std::vector<uint32_t>& u, std::vector<float>& f) {
    check(curandSetPseudoRandomGeneratorSeed(g_, seed), "curandSetPseudoRandomGeneratorSeed");
    check(curandSetGeneratorOffset(g_, offset), "curandSetGeneratorOffset");
    check(curandGenerate(g_, u.data(), u.size()), "curandGenerate");
    check(curandSetGeneratorOffset(g_, offset), "curandSetGeneratorOffset");
    check(curandGenerateUniform(g_, f.data(), f.size()), "curandGenerateUniform");
  }

 private:
  static void check(curandStatus_t s, const char* call) {
    HR_CHECK(s == CURAND_STATUS_SUCCESS, "{} returned cuRAND status {}", call, static_cast<int>(s));
  }
  curandGenerator_t g_{};
};

// The host stream against cuRAND's host generator over seeds and offsets that
// cross the generator's 65536-thread boundary; and the negative control.
std::vector<Measurement> against_curand(const RunContext& ctx) {
  const bool full = ctx.preset == Preset::full;
  const size_t n = full ? 1'200'000 : 300'000;  // 300k draws cross block 65536 (draw 262144)
  std::vector<uint64_t> seeds = {0ull, 1ull, ctx.seed, 0xffffffffffffffffull};
  std::vector<uint64_t> offsets = {0ull, 3ull, 262143ull, (1ull << 33) + 7};
  if (full) {
    seeds.push_back(0x9e3779b97f4a7c15ull);
    offsets.insert(offsets.end(), {1ull, 4ull, 1001ull, 262144ull});
  }
  CurandHost gen;
  std::vector<uint32_t> ref_u(n);
  std::vector<float> ref_f(n);
  size_t bad_u = 0, bad_f = 0, compared = 0, naive_bad = 0, naive_compared = 0, flipped_bad = 0, flipped_f = 0;
  nlohmann::json first_bad = nullptr;
  // The subtle control: the run's own seed at offset 0, one draw with one bit flipped.
  // The uniforms' subtle control flips the top bit, which every float keeps.
  const BitFlip flip = bit_flip(ctx.seed, n), top{flip.index, 0x80000000u};
  auto mismatching_floats = [&](const std::vector<uint32_t>& x) {
    size_t bad = 0;
    for (size_t i = 0; i < n; ++i) {
      const float u = uniform_from_u32(x[i]);
      bad += std::memcmp(&u, &ref_f[i], sizeof u) != 0;
    }
    return bad;
  };
  for (size_t s = 0; s < seeds.size(); ++s) {
    const uint64_t seed = seeds[s];
    for (uint64_t offset : offsets) {
      gen.draw(seed, offset, ref_u, ref_f);
      const std::vector<uint32_t> x = philox_host_draws(seed, offset, n);
      for (size_t i = 0; i < n; ++i)
        if (x[i] != ref_u[i] && bad_u++ == 0) first_bad = {{"seed", seed}, {"offset", offset}, {"index", i}};
      bad_f += mismatching_floats(x);
      compared += n;
      if (offset != 0) continue;
      {  // Gross: counter = draw block, ignoring cuRAND's thread order.
        ScopedPhiloxFault fault({true, -1, 0});
        const std::vector<uint32_t> naive = philox_host_draws(seed, offset, n);
        for (size_t i = 0; i < n; ++i) naive_bad += naive[i] != ref_u[i];
        naive_compared += n;
      }
      if (s != 2) continue;  // seeds[2] is the run's seed: the subtle controls
      {
        ScopedPhiloxFault fault({false, static_cast<int64_t>(flip.index), flip.mask});
        const std::vector<uint32_t> flipped = philox_host_draws(seed, offset, n);
        for (size_t i = 0; i < n; ++i) flipped_bad += flipped[i] != ref_u[i];
      }
      {
        ScopedPhiloxFault fault({false, static_cast<int64_t>(top.index), top.mask});
        flipped_f = mismatching_floats(philox_host_draws(seed, offset, n));
      }
    }
  }
  std::vector<Measurement> out;
  const nlohmann::json cfg{{"seeds", seeds.size()}, {"offsets", offsets.size()}, {"draws_each", n}};
  nlohmann::json ud = nlohmann::json::object();
  if (bad_u > 0) ud["first_mismatch"] = first_bad;
  Measurement u = bitwise("host Philox stream equals cuRAND's PHILOX4_32_10 host generator", "cpu", bad_u, compared,
                          std::move(ud));
  u.config = cfg;
  u.config["check"] = "curand_host_u32";
  out.push_back(u);
  Measurement f = bitwise("host uniform floats equal curandGenerateUniform", "cpu", bad_f, compared, {});
  f.dtype = "fp32";
  f.config = cfg;
  f.config["check"] = "curand_host_uniform";
  out.push_back(f);
  // Caught when more than half the draws differ: a wrong counter order changes
  // essentially every draw (only block 0 coincides).
  Measurement neg = make_negative_control(kId, "counters without cuRAND's 65536-thread order are caught",
                                          static_cast<double>(naive_bad) / static_cast<double>(naive_compared), 0.5,
                                          check_name(kId, u.title));
  neg.backend = "cpu";
  neg.dtype = "uint32";
  neg.model = "op:philox";
  neg.metric = "mismatch_fraction";
  neg.tolerance_reason = "a wrong counter layout must change more than half the draws";
  neg.config = nlohmann::json{{"check", "naive_counter_order"}};
  neg.details = nlohmann::json{{"mismatches", naive_bad}, {"draws_compared", naive_compared}};
  out.push_back(neg);
  out.push_back(one_bit_control("the host stream", "cpu", flipped_bad, n, flip,
                                nlohmann::json{{"check", "curand_host_u32"}, {"draws_each", n}, {"offset", 0}}, u.title));
  Measurement fc = one_bit_control("the stream under the uniforms", "cpu", flipped_f, n, top,
                                   nlohmann::json{{"check", "curand_host_uniform"}, {"draws_each", n}, {"offset", 0}},
                                   f.title);
  fc.dtype = "fp32";
  out.push_back(std::move(fc));
  return out;
}

// On a GPU: the device's draws (kernels use the same HR_HD function) against the host's.
std::vector<Measurement> device_against_host(Device& dev, const RunContext& ctx) {
  const size_t n = ctx.preset == Preset::full ? (size_t{1} << 24) : (size_t{1} << 21);
  size_t bad = 0, compared = 0, flipped_bad = 0;
  const BitFlip flip = bit_flip(ctx.seed, n);
  void* du = dev.allocate(n * sizeof(uint32_t), Consumer::workspace);
  void* df = nullptr;
  try {
    df = dev.allocate(n * sizeof(float), Consumer::workspace);
    std::vector<uint32_t> hu(n);
    std::vector<float> hf(n);
    for (uint64_t offset : {0ull, 5ull, (1ull << 33) + 7}) {
      philox_fill_cuda(dev, static_cast<uint32_t*>(du), static_cast<float*>(df), ctx.seed, offset, n);
      dev.copy_to_host(hu.data(), du, n * sizeof(uint32_t));
      dev.copy_to_host(hf.data(), df, n * sizeof(float));
      for (size_t i = 0; i < n; ++i) {
        const uint32_t x = philox_draw(ctx.seed, offset + i);
        const float u = uniform_from_u32(x);
        bad += (hu[i] != x) + (std::memcmp(&u, &hf[i], sizeof u) != 0);
      }
      compared += 2 * n;
    }
    {  // The subtle control at offset 0: the device kernel with one bit of one draw flipped.
      ScopedPhiloxFault fault({false, static_cast<int64_t>(flip.index), flip.mask});
      philox_fill_cuda(dev, static_cast<uint32_t*>(du), static_cast<float*>(df), ctx.seed, 0, n);
      dev.copy_to_host(hu.data(), du, n * sizeof(uint32_t));
      for (size_t i = 0; i < n; ++i) flipped_bad += hu[i] != philox_draw(ctx.seed, i);
    }
  } catch (...) {
    dev.deallocate(du, n * sizeof(uint32_t), Consumer::workspace);
    if (df) dev.deallocate(df, n * sizeof(float), Consumer::workspace);
    throw;
  }
  dev.deallocate(du, n * sizeof(uint32_t), Consumer::workspace);
  dev.deallocate(df, n * sizeof(float), Consumer::workspace);
  Measurement m = bitwise("device Philox draws and uniforms equal the host's", "cuda", bad, compared, {});
  m.config = nlohmann::json{{"check", "device_vs_host"}, {"draws_each", n}, {"offsets", 3}};
  return {m, one_bit_control("the device's draws", "cuda", flipped_bad, n, flip,
                             nlohmann::json{{"check", "device_vs_host"}, {"draws_each", n}}, m.title)};
}

#endif  // HEADROOM_HAVE_CUDA

std::vector<Measurement> run_ops3(RunContext& ctx) {
  std::vector<Measurement> out = known_answer(ctx.seed);
#if HEADROOM_HAVE_CUDA
  if (ctx.progress) ctx.progress("host stream against cuRAND's host generator");
  for (auto& m : against_curand(ctx)) out.push_back(std::move(m));
  if (ctx.device.is_cuda()) {
    if (ctx.progress) ctx.progress("device draws against host draws");
    for (auto& m : device_against_host(ctx.device, ctx)) out.push_back(std::move(m));
  }
#endif
  return out;
}

}  // namespace

HR_REGISTER_PROPERTY(PropertySpec{kId, "Philox stream bit-identical to cuRAND and across host and device", 1.0,
                                  run_ops3, ""});

}  // namespace hr
