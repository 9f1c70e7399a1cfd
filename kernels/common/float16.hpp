// 16-bit storage formats (IEEE binary16 "fp16" and bfloat16) as plain 16-bit
// structs with conversions shared by host and device. Stores round to nearest
// even, keep subnormals and overflow to inf exactly as the hardware formats do,
// so an underflow measured on the CPU backend means what it means on a GPU.
// On the device the CUDA intrinsics are used; they implement the same rounding.
#pragma once

#include <cstdint>
#include <cstring>

#include "kernels/common/hd.hpp"

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#endif

namespace hr {

struct half_t {
  uint16_t bits;
};
struct bfloat16_t {
  uint16_t bits;
};

HR_HD uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
#endif
}

HR_HD float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}

// ---- fp16 -----------------------------------------------------------------------
HR_HD uint16_t float_to_half_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __half_as_ushort(__float2half_rn(f));
#else
  const uint32_t x = float_bits(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t ax = x & 0x7fffffffu;
  if (ax >= 0x7f800000u) {  // inf or NaN; NaN stays quiet NaN with its top payload
    return static_cast<uint16_t>(sign | 0x7c00u | (ax > 0x7f800000u ? (0x200u | ((ax >> 13) & 0x3ffu)) : 0u));
  }
  if (ax >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65520 rounds to inf
  if (ax >= 0x38800000u) {  // normal half: rebias the exponent, round the 13 dropped bits
    const uint32_t r = ax - 0x38000000u;
    return static_cast<uint16_t>(sign | ((r + 0x0fffu + ((r >> 13) & 1u)) >> 13));
  }
  // Subnormal half (or zero): value / 2^-24, rounded to nearest even.
  const uint32_t e = ax >> 23;
  if (e == 0) return static_cast<uint16_t>(sign);  // fp32 subnormals are far below 2^-25
  const uint32_t mant = (ax & 0x7fffffu) | 0x800000u;
  const uint32_t shift = 126u - e;  // >= 14 here
  if (shift >= 32u) return static_cast<uint16_t>(sign);
  uint32_t q = mant >> shift;
  const uint32_t rem = mant & ((1u << shift) - 1u);
  const uint32_t halfway = 1u << (shift - 1u);
  if (rem > halfway || (rem == halfway && (q & 1u))) ++q;
  return static_cast<uint16_t>(sign | q);
#endif
}

HR_HD float half_bits_to_float(uint16_t h) {
#if defined(__CUDA_ARCH__)
  return __half2float(__ushort_as_half(h));
#else
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1fu;
  uint32_t m = h & 0x3ffu;
  if (e == 0x1fu) return bits_float(sign | 0x7f800000u | (m << 13));
  if (e != 0) return bits_float(sign | ((e + 112u) << 23) | (m << 13));
  if (m == 0) return bits_float(sign);
  // Subnormal: normalise.
  int exp = -14;
  while ((m & 0x400u) == 0) {
    m <<= 1;
    --exp;
  }
  m &= 0x3ffu;
  return bits_float(sign | (static_cast<uint32_t>(exp + 127) << 23) | (m << 13));
#endif
}

// ---- bf16 -----------------------------------------------------------------------
HR_HD uint16_t float_to_bf16_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __bfloat16_as_ushort(__float2bfloat16_rn(f));
#else
  const uint32_t x = float_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // quiet NaN
  return static_cast<uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
#endif
}

HR_HD float bf16_bits_to_float(uint16_t b) { return bits_float(static_cast<uint32_t>(b) << 16); }

// ---- Generic load/store used by every kernel ---------------------------------------
HR_HD float to_float(float v) { return v; }
HR_HD float to_float(half_t v) { return half_bits_to_float(v.bits); }
HR_HD float to_float(bfloat16_t v) { return bf16_bits_to_float(v.bits); }

template <typename T>
HR_HD T from_float(float v);
template <>
HR_HD float from_float<float>(float v) {
  return v;
}
template <>
HR_HD half_t from_float<half_t>(float v) {
  return half_t{float_to_half_bits(v)};
}
template <>
HR_HD bfloat16_t from_float<bfloat16_t>(float v) {
  return bfloat16_t{float_to_bf16_bits(v)};
}

// Value after one round trip through the storage type T.
template <typename T>
HR_HD float round_to(float v) {
  return to_float(from_float<T>(v));
}

}  // namespace hr
