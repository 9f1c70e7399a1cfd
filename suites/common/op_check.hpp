// Shared checks of the op conformance tests (OPS-1, OPS-2): NMSE against a float64
// reference that no NaN can pass and that admits inf only where the reference has
// the same inf, and output tensors wrapped in sentinel bytes that catch a kernel
// writing outside its output.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "harness/tensor.hpp"
#include "suites/common/tolerances.hpp"

namespace hr::test {

// NMSE = sum (a - b)^2 / sum b^2 over the finite reference elements. NaN in `got`
// gives NaN (never within a bound); inf in `got` must equal the reference's inf,
// else the result is inf. All-zero reference: 0 when got is all zero, else inf.
inline double nmse(const std::vector<float>& got, const std::vector<double>& ref) {
  if (got.size() != ref.size()) return std::nan("");
  double err = 0, norm = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double a = got[i], b = ref[i];
    if (std::isnan(a) || std::isnan(b)) return std::nan("");
    if (std::isinf(a) || std::isinf(b)) {
      if (a != b) return INFINITY;
      continue;
    }
    err += (a - b) * (a - b);
    norm += b * b;
  }
  if (norm == 0) return err == 0 ? 0.0 : INFINITY;
  return err / norm;
}

// The assertion every OPS-1/OPS-2 comparison uses: fails on NaN (NaN <= x is false).
inline testing::AssertionResult nmse_within(const std::vector<float>& got, const std::vector<double>& ref,
                                            const tol::Bound& bound, double* measured = nullptr) {
  const double e = nmse(got, ref);
  if (measured) *measured = e;
  if (e <= bound.nmse) return testing::AssertionSuccess();
  return testing::AssertionFailure() << "NMSE " << e << " over bound " << bound.nmse << " (" << bound.reason
                                     << "), n=" << got.size();
}

inline std::vector<double> to_double(const std::vector<float>& v) { return {v.begin(), v.end()}; }

// Values as stored in `dtype` (what the op really reads), as doubles for a reference.
inline std::vector<double> stored_values(const Tensor& t) { return to_double(t.to_host_f32()); }

// An output tensor with kGuardElems sentinel elements on each side inside one
// allocation. The op sees only the middle view; guards_intact() checks that no
// byte around it changed.
class GuardedTensor {
 public:
  static constexpr int64_t kGuardElems = 64;  // > any vector width; keeps 16-byte alignment

  GuardedTensor(Device& dev, Shape shape, DType dtype, Consumer c = Consumer::activations) {
    const int64_t n = shape_numel(shape);
    whole_ = Tensor::empty(dev, {n + 2 * kGuardElems}, dtype, c);
    std::vector<uint8_t> bytes(whole_.nbytes());
    for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = sentinel(i);
    whole_.from_host_bytes(bytes.data(), bytes.size());
    view_ = whole_.slice(kGuardElems, kGuardElems + n).reshape(std::move(shape));
  }

  Tensor& tensor() { return view_; }

  // Initial contents of the view (for ops that accumulate into their output).
  void set(const std::vector<float>& values) {
    Tensor tmp = Tensor::from_host(view_.device(), values, view_.shape(), view_.dtype(), Consumer::workspace);
    view_.copy_from(tmp);
  }

  testing::AssertionResult guards_intact() const {
    const std::vector<uint8_t> bytes = whole_.to_host_bytes();
    const size_t guard = static_cast<size_t>(kGuardElems) * dtype_size(whole_.dtype());
    for (size_t i = 0; i < bytes.size(); ++i) {
      if (i == guard) i = bytes.size() - guard;  // skip the view
      if (bytes[i] != sentinel(i))
        return testing::AssertionFailure() << "sentinel byte " << i << " of " << whole_.str() << " overwritten";
    }
    return testing::AssertionSuccess();
  }

 private:
  static uint8_t sentinel(size_t i) { return static_cast<uint8_t>(0xA5u ^ (i * 29u)); }
  Tensor whole_, view_;
};

inline const std::vector<int64_t>& edge_sizes() {
  static const std::vector<int64_t> v{1, 15, 16, 17, 127, 128, 129, 4097, int64_t{1} << 20};
  return v;
}

}  // namespace hr::test
