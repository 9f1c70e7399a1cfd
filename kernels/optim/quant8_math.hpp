// Block-wise 8-bit quantisation of optimizer state (Dettmers et al. 2022, "8-bit
// Optimizers via Block-wise Quantization"): the dynamic tree maps, nearest-code
// quantisation and the per-block absmax, shared by the CPU loops and the CUDA
// kernels so that both backends encode with the same codebook and the same rules.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/common/hd.hpp"
#include "kernels/optim/optim_math.hpp"

namespace hr::q8 {

inline constexpr int kCodes = 256;
inline constexpr int64_t kDefaultBlock = 256;
inline constexpr int64_t kLargeBlock = 2048;
// Tensors with fewer elements keep fp32 state (bitsandbytes' min_8bit_size): the
// absmax and the codebook cost more than they save, and small tensors (biases,
// norm weights) are the ones most sensitive to state noise.
inline constexpr int64_t kMin8bitNumel = 4096;

enum class MapKind : uint8_t {
  dynamic_signed,    // first moment: 127 negative, 0, 127 positive codes and 1.0
  dynamic_unsigned,  // second moment: 0, 254 positive codes and 1.0
  linear_signed,     // a uniform grid on [-1, 1]: the negative control of Q8-1
  linear_unsigned,   // a uniform grid on [0, 1]
};

// The sorted codebook of one map: value[i] is the normalised value of code i.
struct Codebook {
  float value[kCodes];
};

// Positive half of the dynamic map: decade d (0..6) covers [0.1, 1) * 10^(d-6)
// with `per_decade << d` linearly spaced values (the midpoints of a linspace of
// `(per_decade << d) + 1` boundaries). The signed map has per_decade 1 (its sign
// takes one bit), the unsigned one 2. Index j counts from the smallest.
HR_HD double dynamic_positive(int per_decade, int j) {
  int d = 0, start = 0;
  while (d < 6 && j >= start + (per_decade << d)) {
    start += per_decade << d;
    ++d;
  }
  const int count = per_decade << d;
  const int k = j - start;
  const double lo = 0.1, step = 0.9 / count;
  const double mid = lo + step * (k + 0.5);
  double scale = 1.0;
  for (int e = d; e < 6; ++e) scale *= 0.1;
  return mid * scale;
}

// The value of sorted code `i` of a map (double; stored as float in a Codebook).
HR_HD double map_value(MapKind kind, int i) {
  switch (kind) {
    case MapKind::dynamic_signed:
      // 0..126: negatives (mirror of the positives), 127: zero, 128..254: positives, 255: 1.
      if (i == 255) return 1.0;
      if (i == 127) return 0.0;
      if (i > 127) return dynamic_positive(1, i - 128);
      return -dynamic_positive(1, 126 - i);
    case MapKind::dynamic_unsigned:
      if (i == 0) return 0.0;
      if (i == 255) return 1.0;
      return dynamic_positive(2, i - 1);
    case MapKind::linear_signed: return -1.0 + 2.0 * i / 255.0;
    case MapKind::linear_unsigned: return i / 255.0;
  }
  return 0.0;
}

inline Codebook make_codebook(MapKind kind) {
  Codebook c{};
  for (int i = 0; i < kCodes; ++i) c.value[i] = static_cast<float>(map_value(kind, i));
  return c;
}

// Nearest code to a normalised value x (|x| <= 1), by binary search over the
// sorted codebook; a tie goes to the lower code. Values beyond the ends take the
// end codes.
HR_HD uint8_t encode(const Codebook& c, float x) {
  int lo = 0, hi = kCodes - 1;
  if (!(x > c.value[lo])) return 0;
  if (!(x < c.value[hi])) return static_cast<uint8_t>(hi);
  while (hi - lo > 1) {  // invariant: value[lo] < x < value[hi]... or equal at lo
    const int mid = (lo + hi) / 2;
    if (c.value[mid] <= x) lo = mid;
    else hi = mid;
  }
  return static_cast<uint8_t>(x - c.value[lo] <= c.value[hi] - x ? lo : hi);
}

// A block's value from its code and absmax.
HR_HD float decode(const Codebook& c, uint8_t code, float absmax) { return c.value[code] * absmax; }

// Quantises x with the block's absmax (0: the whole block is zero).
HR_HD uint8_t quantize(const Codebook& c, float x, float absmax) {
  return encode(c, absmax > 0.f ? x / absmax : 0.f);
}

// One element of the 8-bit AdamW step: the moments are decoded with the block's
// current absmax, updated in fp32 by the very AdamW of optim_math.hpp, and the
// parameter takes its step from the fp32 moments (as bitsandbytes does); the
// caller re-encodes *m and *v with the block's new absmax.
HR_HD float adamw8(float p, float g, uint8_t m_code, uint8_t v_code, float m_absmax, float v_absmax,
                   const Codebook& m_map, const Codebook& v_map, const optim::AdamWScalars& s, float* m, float* v) {
  *m = decode(m_map, m_code, m_absmax);
  *v = decode(v_map, v_code, v_absmax);
  return optim::adamw(p, g, m, v, s);
}

inline int64_t block_count(int64_t numel, int64_t block) { return (numel + block - 1) / block; }

}  // namespace hr::q8
