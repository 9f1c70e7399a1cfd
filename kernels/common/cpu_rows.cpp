#include "kernels/common/cpu_rows.hpp"

#include <cmath>
#include <vector>

#include "kernels/common/cpu_vector_math.hpp"

namespace hr::ops::rows {
namespace {

double fixed_order_sum(const double (&acc)[kLanes]) {
  static_assert(kLanes == 8, "the order below is for 8 lanes");
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

}  // namespace

float* row_buffer(int64_t n) {
  thread_local std::vector<float> buf;
  if (static_cast<int64_t>(buf.size()) < n) buf.resize(static_cast<size_t>(n));
  return buf.data();
}

HR_CPU_CLONES float max_of(const float* __restrict e, int64_t n) {
  float mx[kLanes];
  for (int64_t j = 0; j < kLanes; ++j) mx[j] = -INFINITY;
  for (int64_t i = 0; i < n; i += kLanes)
    for (int64_t j = 0; j < kLanes; ++j) mx[j] = e[i + j] > mx[j] ? e[i + j] : mx[j];  // a NaN is passed over
  float m = -INFINITY;
  for (int64_t j = 0; j < kLanes; ++j) m = mx[j] > m ? mx[j] : m;
  return m;
}

HR_CPU_CLONES double exp_shifted_sum(float* __restrict e, int64_t n, float shift) {
  for (int64_t i = 0; i < n; ++i) e[i] = expf(e[i] - shift);
  double acc[kLanes] = {};
  for (int64_t i = 0; i < n; i += kLanes)
    for (int64_t j = 0; j < kLanes; ++j) acc[j] += static_cast<double>(e[i + j]);
  return fixed_order_sum(acc);
}

HR_CPU_CLONES double dot(const float* __restrict a, const float* __restrict b, int64_t n) {
  double acc[kLanes] = {};
  const int64_t whole = n - n % kLanes;
  for (int64_t i = 0; i < whole; i += kLanes)
    for (int64_t j = 0; j < kLanes; ++j) acc[j] += static_cast<double>(a[i + j] * b[i + j]);
  for (int64_t i = whole; i < n; ++i) acc[i - whole] += static_cast<double>(a[i] * b[i]);
  return fixed_order_sum(acc);
}

HR_CPU_CLONES double sum(const float* __restrict a, int64_t n) {
  double acc[kLanes] = {};
  const int64_t whole = n - n % kLanes;
  for (int64_t i = 0; i < whole; i += kLanes)
    for (int64_t j = 0; j < kLanes; ++j) acc[j] += static_cast<double>(a[i + j]);
  for (int64_t i = whole; i < n; ++i) acc[i - whole] += static_cast<double>(a[i]);
  return fixed_order_sum(acc);
}

HR_CPU_CLONES double sum_sq_dev(const float* __restrict a, int64_t n, double m) {
  double acc[kLanes] = {};
  const int64_t whole = n - n % kLanes;
  for (int64_t i = 0; i < whole; i += kLanes)
    for (int64_t j = 0; j < kLanes; ++j) {
      const double d = static_cast<double>(a[i + j]) - m;
      acc[j] += d * d;
    }
  for (int64_t i = whole; i < n; ++i) {
    const double d = static_cast<double>(a[i]) - m;
    acc[i - whole] += d * d;
  }
  return fixed_order_sum(acc);
}

}  // namespace hr::ops::rows
