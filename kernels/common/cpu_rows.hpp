// Row loops of the CPU's ops, vectorised (cpu_vector_math.hpp; cpu_rows.cpp is
// compiled for it, without FMA contraction). Softmax and cross-entropy put every row
// through a float buffer padded to whole vectors of kLanes (max_of and
// exp_shifted_sum take whole vectors), so every element, wherever it lies, takes
// the same vector expf (a loop's scalar remainder would round differently). A
// padding or masked element holds -inf: it adds nothing to a max or a sum of
// exponentials. Double sums take kLanes partial sums (element i into lane
// i % kLanes), added in one fixed order; dot, sum and sum_sq_dev (LayerNorm's row
// statistics) take any n, its tail in the first lanes.
#pragma once

#include <cstdint>

namespace hr::ops::rows {

inline constexpr int64_t kLanes = 8;  // AVX2's floats per vector (and twice SSE's)

inline int64_t padded(int64_t n) { return (n + kLanes - 1) / kLanes * kLanes; }

// A float buffer of at least n elements, one per thread (grown to the widest row
// seen), for the row at hand: scratch, not a tensor.
float* row_buffer(int64_t n);

// max over e[0, n), n whole vectors (-inf when every element is -inf).
float max_of(const float* e, int64_t n);

// e[i] = expf(e[i] - shift) over n whole vectors; returns their sum in double.
double exp_shifted_sum(float* e, int64_t n, float shift);

// sum over i < n of double(a[i] * b[i]) (fp32 products), any n.
double dot(const float* a, const float* b, int64_t n);

// sum over i < n of double(a[i]), any n.
double sum(const float* a, int64_t n);

// sum over i < n of (double(a[i]) - m)^2, any n (each square rounded on its own:
// the file is compiled without contraction, so both clones give the same bits).
double sum_sq_dev(const float* a, int64_t n, double m);

}  // namespace hr::ops::rows
