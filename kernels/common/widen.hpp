// 16-bit floats widened to fp32 over whole arrays on the host: what CPU products,
// CPU attention, the CPU's row ops and host copies of tensors read.
// floats_of gives a row as floats without a copy when it already is fp32.
// fp16 goes through a table of all 65,536 fp16 values' floats (256 KiB, made once
// from half_bits_to_float, so the bits are the same): one load per element, where
// the conversion's branches (subnormals, inf and NaN) keep the loop scalar at
// several times that. Widening the fp16 operands of CPU products took 6.5% of a
// quick-preset run's time by the conversion, 4.4% by the table (most of it now the
// stores). bf16 is its bits shifted into the high half, which vectorises as it is.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "kernels/common/float16.hpp"

namespace hr {

inline const float* half_to_float_table() {
  static const std::vector<float> table = [] {
    std::vector<float> t(0x10000);
    for (uint32_t h = 0; h < 0x10000u; ++h) t[h] = half_bits_to_float(static_cast<uint16_t>(h));
    return t;
  }();
  return table.data();
}

inline void widen_floats(const half_t* src, float* dst, int64_t n) {
  const float* t = half_to_float_table();
  for (int64_t i = 0; i < n; ++i) dst[i] = t[src[i].bits];
}

inline void widen_floats(const bfloat16_t* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = bf16_bits_to_float(src[i].bits);
}

inline void widen_floats(const float* src, float* dst, int64_t n) {
  if (n > 0) std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
}

// n values of src as floats: src itself when it is fp32, else widened into buf.
template <typename T>
const float* floats_of(const T* src, int64_t n, float* buf) {
  if constexpr (std::is_same_v<T, float>) {
    return src;
  } else {
    widen_floats(src, buf, n);
    return buf;
  }
}

}  // namespace hr
