// Float64 reference matrix products (see matmul_ref.hpp).
#include "kernels/matmul/matmul_ref.hpp"

#include "harness/check.hpp"

namespace hr::ref {

std::vector<double> matmul(const std::vector<double>& a, bool trans_a, const std::vector<double>& b, bool trans_b,
                           const std::vector<double>& c, int64_t batch, int64_t m, int64_t n, int64_t k,
                           double alpha, double beta) {
  HR_CHECK(static_cast<int64_t>(a.size()) == batch * m * k && static_cast<int64_t>(b.size()) == batch * k * n &&
               static_cast<int64_t>(c.size()) == batch * m * n,
           "ref::matmul sizes a {} b {} c {} for batch {} m {} n {} k {}", a.size(), b.size(), c.size(), batch, m,
           n, k);
  std::vector<double> out(c.size());
  for (int64_t e = 0; e < batch; ++e) {
    const double* A = a.data() + e * m * k;
    const double* B = b.data() + e * k * n;
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double s = 0;
        for (int64_t p = 0; p < k; ++p) {
          const double av = trans_a ? A[p * m + i] : A[i * k + p];
          const double bv = trans_b ? B[j * k + p] : B[p * n + j];
          s += av * bv;
        }
        const int64_t ci = e * m * n + i * n + j;
        // beta == 0 never reads c, as BLAS: a NaN there must not leak through.
        out[ci] = alpha * s + (beta == 0.0 ? 0.0 : beta * c[ci]);
      }
  }
  return out;
}

std::vector<double> linear(const std::vector<double>& x, const std::vector<double>& w,
                           const std::vector<double>& bias, int64_t n, int64_t in, int64_t out) {
  std::vector<double> y = matmul(x, false, w, true, std::vector<double>(n * out), 1, n, out, in);
  if (!bias.empty())
    for (int64_t r = 0; r < n; ++r)
      for (int64_t o = 0; o < out; ++o) y[r * out + o] += bias[o];
  return y;
}

}  // namespace hr::ref
