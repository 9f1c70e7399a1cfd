// Helpers for op conformance tests (OPS-1 / OPS-2 / DET-1): the NMSE of a result
// against its float64 reference (NaN never passes), outputs surrounded by sentinel
// bytes that must survive the op, and inputs as the op sees them after rounding.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "harness/compare.hpp"
#include "harness/tensor.hpp"
#include "kernels/common/float16.hpp"

namespace hr::test {

using hr::nmse;  // harness/compare.hpp: one definition for tests and run-time properties

// gtest predicate: "EXPECT_TRUE(nmse_within(got, want, bound, what))".
inline testing::AssertionResult nmse_within(const std::vector<float>& got, const std::vector<double>& want,
                                            double bound, const std::string& what) {
  const double e = nmse(got, want);
  // HEADROOM_PRINT_NMSE=1 prints every measurement, to see the headroom under each bound.
  if (const char* p = std::getenv("HEADROOM_PRINT_NMSE"); p != nullptr && p[0] == '1')
    std::printf("nmse %-48s %.3e (bound %.1e)\n", what.c_str(), e, bound);
  if (e <= bound) return testing::AssertionSuccess() << what << ": nmse " << e << " <= " << bound;
  return testing::AssertionFailure() << what << ": nmse " << e << " > bound " << bound << " (" << got.size()
                                     << " values)";
}

// The value an fp32 host value has once stored as `t` (what the op reads).
inline float stored_value(float v, DType t) {
  switch (t) {
    case DType::f16: return round_to<half_t>(v);
    case DType::bf16: return round_to<bfloat16_t>(v);
    default: return v;
  }
}
inline std::vector<double> stored_values(const std::vector<float>& v, DType t) {
  std::vector<double> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = stored_value(v[i], t);
  return out;
}
inline std::vector<double> widen(const std::vector<float>& v) { return {v.begin(), v.end()}; }

// An output tensor with `guard` elements of sentinel bytes before and after it in
// the same allocation. The view itself starts as all-ones bytes (NaN in every
// float dtype), so an element the op forgets to write fails the NMSE check.
class Guarded {
 public:
  static constexpr uint8_t kSentinel = 0xA5;

  Guarded(Device& dev, Shape shape, DType dtype, int64_t guard = 64, Consumer c = Consumer::activations)
      : guard_(guard) {
    const int64_t n = shape_numel(shape);
    whole_ = Tensor::empty(dev, {n + 2 * guard}, dtype, c);
    std::vector<uint8_t> bytes(whole_.nbytes(), kSentinel);
    const size_t es = dtype_size(dtype);
    std::fill(bytes.begin() + static_cast<std::ptrdiff_t>(guard * es),
              bytes.begin() + static_cast<std::ptrdiff_t>((guard + n) * es), uint8_t{0xFF});
    whole_.from_host_bytes(bytes.data(), bytes.size());
    view_ = whole_.slice(guard, guard + n).reshape(std::move(shape));
  }
  // Starts the view with given values instead (for outputs that accumulate, +=).
  void set(const std::vector<float>& v) {
    Tensor t = Tensor::from_host(view_.device(), v, view_.shape(), view_.dtype(), Consumer::workspace);
    view_.copy_from(t);
  }

  Tensor& tensor() { return view_; }
  std::vector<float> values() const { return view_.to_host_f32(); }
  // True when every sentinel byte outside the view is unchanged.
  bool guards_intact() const {
    const std::vector<uint8_t> b = whole_.to_host_bytes();
    const size_t g = static_cast<size_t>(guard_) * dtype_size(whole_.dtype());
    for (size_t i = 0; i < g; ++i)
      if (b[i] != kSentinel || b[b.size() - 1 - i] != kSentinel) return false;
    return true;
  }

 private:
  int64_t guard_;
  Tensor whole_, view_;
};

// The edge sizes of every op test (DESIGN.md: 1, 15, 16, 17, 127, 128, 129, 4097)
// plus one large size: around vector widths, warp and block sizes.
inline const std::vector<int64_t>& edge_sizes() {
  static const std::vector<int64_t> v{1, 15, 16, 17, 127, 128, 129, 4097, int64_t{1} << 20};
  return v;
}

// The values a tensor holds, as doubles for a float64 reference.
inline std::vector<double> stored_values(const Tensor& t) { return widen(t.to_host_f32()); }

}  // namespace hr::test
