// Element-wise ops: argument checks, backend dispatch, and the CPU loops. The
// loops are plain and branch-free per element so the compiler can vectorise the
// fp32 case; 16-bit storage goes through hr::to_float / hr::from_float.
#include "kernels/elementwise/elementwise.hpp"

#include <vector>

#include "kernels/common/dispatch.hpp"
#include "kernels/common/dtype_dispatch.hpp"
#include "kernels/common/widen.hpp"
#include "kernels/elementwise/elementwise_math.hpp"

#if HEADROOM_HAVE_CUDA
#include "kernels/elementwise/elementwise_cuda.hpp"
#endif

namespace hr::ops {
namespace {

void check_float(const Tensor& t, const char* op) {
  HR_CHECK(t.defined(), "{}: undefined tensor", op);
  HR_CHECK(is_float(t.dtype()), "{}: {} is not a float tensor", op, t.str());
}

// [N, C] view of y for the bias ops: C = last dimension, N = everything before it.
void check_bias(const Tensor& y, const Tensor& bias, const char* op) {
  check_float(y, op);
  check_float(bias, op);
  check_same_device(y, bias, op);
  HR_CHECK(y.ndim() >= 1 && bias.ndim() == 1 && bias.dim(0) == y.dim(-1),
           "{}: bias {} does not match the last dimension of {}", op, bias.str(), y.str());
}

}  // namespace

void add(const Tensor& a, const Tensor& b, Tensor& out) {
  check_float(a, "add");
  check_same_shape(a, b, "add");
  check_same_shape(a, out, "add");
  check_same_device(a, b, "add");
  check_same_device(a, out, "add");
  HR_CHECK(a.dtype() == b.dtype() && a.dtype() == out.dtype(), "add: dtypes differ: {}, {}, {}", a.str(),
           b.str(), out.str());
  HR_IF_CUDA(out, cuda::add(a, b, out));
  dispatch_float(a.dtype(), "add", [&](auto tag) {
    using T = decltype(tag);
    const T* pa = a.data_as<T>();
    const T* pb = b.data_as<T>();
    T* po = out.data_as<T>();
    const int64_t n = out.numel();
    for (int64_t i = 0; i < n; ++i) po[i] = from_float<T>(ew::add(to_float(pa[i]), to_float(pb[i])));
  });
}

void scale(const Tensor& x, float alpha, Tensor& out) {
  check_float(x, "scale");
  check_same_shape(x, out, "scale");
  check_same_device(x, out, "scale");
  HR_CHECK(x.dtype() == out.dtype(), "scale: dtypes differ: {} vs {}", x.str(), out.str());
  HR_IF_CUDA(out, cuda::scale(x, alpha, out));
  dispatch_float(x.dtype(), "scale", [&](auto tag) {
    using T = decltype(tag);
    const T* px = x.data_as<T>();
    T* po = out.data_as<T>();
    const int64_t n = out.numel();
    for (int64_t i = 0; i < n; ++i) po[i] = from_float<T>(ew::scale(alpha, to_float(px[i])));
  });
}

void axpy(float alpha, const Tensor& x, Tensor& y) {
  check_float(x, "axpy");
  check_float(y, "axpy");
  check_same_shape(x, y, "axpy");
  check_same_device(x, y, "axpy");
  HR_IF_CUDA(y, cuda::axpy(alpha, x, y));
  dispatch_float2(x.dtype(), y.dtype(), "axpy", [&](auto tx, auto ty) {
    using TX = decltype(tx);
    using TY = decltype(ty);
    const TX* px = x.data_as<TX>();
    TY* py = y.data_as<TY>();
    const int64_t n = y.numel();
    for (int64_t i = 0; i < n; ++i) py[i] = from_float<TY>(ew::axpy(alpha, to_float(px[i]), to_float(py[i])));
  });
}

void cast(const Tensor& x, Tensor& out) {
  check_float(x, "cast");
  check_float(out, "cast");
  check_same_shape(x, out, "cast");
  check_same_device(x, out, "cast");
  if (x.dtype() == out.dtype()) {
    if (x.data() != out.data()) out.copy_from(x);
    return;
  }
  HR_IF_CUDA(out, cuda::cast(x, out));
  dispatch_float2(x.dtype(), out.dtype(), "cast", [&](auto tx, auto to) {
    using TX = decltype(tx);
    using TO = decltype(to);
    const TX* px = x.data_as<TX>();
    TO* po = out.data_as<TO>();
    const int64_t n = out.numel();
    for (int64_t i = 0; i < n; ++i) po[i] = from_float<TO>(to_float(px[i]));
  });
}

void fill(Tensor& out, float value) {
  check_float(out, "fill");
  HR_IF_CUDA(out, cuda::fill(out, value));
  dispatch_float(out.dtype(), "fill", [&](auto tag) {
    using T = decltype(tag);
    const T v = from_float<T>(value);
    T* po = out.data_as<T>();
    const int64_t n = out.numel();
    for (int64_t i = 0; i < n; ++i) po[i] = v;
  });
}

void add_bias(Tensor& y, const Tensor& bias) {
  check_bias(y, bias, "add_bias");
  HR_IF_CUDA(y, cuda::add_bias(y, bias));
  dispatch_float2(y.dtype(), bias.dtype(), "add_bias", [&](auto ty, auto tb) {
    using TY = decltype(ty);
    using TB = decltype(tb);
    const int64_t cols = bias.numel(), rows = cols == 0 ? 0 : y.numel() / cols;
    std::vector<float> b(static_cast<size_t>(cols));
    widen_floats(bias.data_as<TB>(), b.data(), cols);
    TY* py = y.data_as<TY>();
    for (int64_t r = 0; r < rows; ++r) {
      TY* row = py + r * cols;
      for (int64_t c = 0; c < cols; ++c) row[c] = from_float<TY>(ew::add(to_float(row[c]), b[static_cast<size_t>(c)]));
    }
  });
}

void bias_grad(const Tensor& dy, Tensor& dbias) {
  check_bias(dy, dbias, "bias_grad");
  HR_IF_CUDA(dbias, cuda::bias_grad(dy, dbias));
  dispatch_float2(dy.dtype(), dbias.dtype(), "bias_grad", [&](auto tdy, auto tdb) {
    using TDY = decltype(tdy);
    using TDB = decltype(tdb);
    const int64_t cols = dbias.numel(), rows = cols == 0 ? 0 : dy.numel() / cols;
    // Rows in order into one fp32 accumulator per column: fixed order, and the
    // inner loop over columns vectorises.
    std::vector<float> acc(static_cast<size_t>(cols), 0.f);
    const TDY* pdy = dy.data_as<TDY>();
    for (int64_t r = 0; r < rows; ++r) {
      const TDY* row = pdy + r * cols;
      for (int64_t c = 0; c < cols; ++c) acc[static_cast<size_t>(c)] += to_float(row[c]);
    }
    TDB* pdb = dbias.data_as<TDB>();
    for (int64_t c = 0; c < cols; ++c)
      pdb[c] = from_float<TDB>(ew::add(to_float(pdb[c]), acc[static_cast<size_t>(c)]));
  });
}

}  // namespace hr::ops
