// Philox4x32-10 counter-based generator (Salmon et al., SC'11), written once for
// host and device. It reproduces cuRAND's CURAND_RNG_PSEUDO_PHILOX4_32_10 stream,
// so a mask drawn on either backend is bit-identical and can be replayed.
//
// The stream of a seed is cuRAND's host-generator order: that generator emulates
// 65536 device threads, thread t on subsequence t, each taking one counter step per
// round. So draw n (n = 0, 1, 2, ...) is word n % 4 of block b = n / 4, and block b
// is Philox(key = seed, counter = {low 64 bits: b / 65536, subsequence: b % 65536}).
// curandSetGeneratorOffset(n0) starts that stream at draw n0.
//
// Element i of a tensor drawn at (seed, offset) uses draw offset + i of that
// stream. A draw over N elements advances the offset by N, rounded up to a multiple
// of 4 so every draw starts on a counter boundary. Replay = same (seed, offset).
#pragma once

#include <cstdint>

#include "kernels/common/hd.hpp"

namespace hr {

struct Philox4 {
  uint32_t x, y, z, w;
};

HR_HD uint32_t mulhilo32(uint32_t a, uint32_t b, uint32_t* hi) {
  const uint64_t p = static_cast<uint64_t>(a) * static_cast<uint64_t>(b);
  *hi = static_cast<uint32_t>(p >> 32);
  return static_cast<uint32_t>(p);
}

// Ten rounds of Philox4x32 on a 128-bit counter with a 64-bit key.
HR_HD Philox4 philox4x32_10(Philox4 ctr, uint32_t k0, uint32_t k1) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    uint32_t hi0, hi1;
    const uint32_t lo0 = mulhilo32(kM0, ctr.x, &hi0);
    const uint32_t lo1 = mulhilo32(kM1, ctr.z, &hi1);
    ctr = Philox4{hi1 ^ ctr.y ^ k0, lo1, hi0 ^ ctr.w ^ k1, lo0};
    k0 += kW0;
    k1 += kW1;
  }
  return ctr;
}

// The four draws of counter block `block` (= draw index / 4) of the seed's stream.
constexpr uint64_t kPhiloxThreads = 65536;  // cuRAND's host-generator thread count

HR_HD Philox4 philox_block(uint64_t seed, uint64_t block) {
  const uint64_t step = block / kPhiloxThreads;
  const Philox4 ctr{static_cast<uint32_t>(step), static_cast<uint32_t>(step >> 32),
                    static_cast<uint32_t>(block % kPhiloxThreads), 0u};
  return philox4x32_10(ctr, static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
}

// Draw n of the seed's stream.
HR_HD uint32_t philox_draw(uint64_t seed, uint64_t n) {
  const Philox4 r = philox_block(seed, n >> 2);
  switch (n & 3u) {
    case 0: return r.x;
    case 1: return r.y;
    case 2: return r.z;
    default: return r.w;
  }
}

// cuRAND's uniform float in (0, 1]: x * 2^-32 + 2^-33.
// Written without a fused multiply-add on the device so both backends round alike.
HR_HD float uniform_from_u32(uint32_t x) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(__fmul_rn(static_cast<float>(x), 2.3283064365386963e-10f), 1.1641532182693481e-10f);
#else
  return static_cast<float>(x) * 2.3283064365386963e-10f + 1.1641532182693481e-10f;
#endif
}

// Offset advance of a draw of n elements: whole counter blocks.
HR_HD uint64_t philox_advance(uint64_t n) { return (n + 3u) & ~static_cast<uint64_t>(3u); }

}  // namespace hr
