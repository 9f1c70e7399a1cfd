// Matrix products: argument checks, dispatch, and the CPU backend (CBLAS sgemm
// from OpenBLAS). fp16/bf16 operands are widened into fp32 workspace tensors so
// the product accumulates in fp32 exactly as cuBLAS's CUBLAS_COMPUTE_32F does; the
// result is rounded once, on the store into c.
#include "kernels/matmul/matmul.hpp"

#include <cblas.h>

#include <cstring>

#include "harness/check.hpp"
#include "kernels/common/dispatch.hpp"
#include "kernels/common/dtype_dispatch.hpp"
#include "kernels/common/float16.hpp"
#include "kernels/common/op_fault.hpp"
#include "kernels/common/widen.hpp"
#include "kernels/elementwise/elementwise.hpp"

#if HEADROOM_HAVE_CUDA
#include "kernels/matmul/matmul_cuda.hpp"
#endif

namespace hr::ops {
namespace {

struct GemmDims {
  int64_t batch, m, n, k;
};

// Checks dtypes, devices and shapes of a product; `batched` expects a leading batch
// dimension on all three tensors.
GemmDims check_gemm(const char* op, const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& c,
                    bool batched) {
  HR_CHECK(a.defined() && b.defined() && c.defined(), "{}: undefined operand", op);
  HR_CHECK(is_float(a.dtype()) && a.dtype() == b.dtype(), "{}: a {} and b {} must share one float dtype", op,
           a.str(), b.str());
  HR_CHECK(c.dtype() == a.dtype() || c.dtype() == DType::f32, "{}: c {} must be {} or fp32", op, c.str(),
           dtype_name(a.dtype()));
  check_same_device(a, b, op);
  check_same_device(a, c, op);
  const int nd = batched ? 3 : 2;
  HR_CHECK(a.ndim() == nd && b.ndim() == nd && c.ndim() == nd, "{}: expected {}-d operands, got a {} b {} c {}", op,
           nd, shape_str(a.shape()), shape_str(b.shape()), shape_str(c.shape()));
  GemmDims d{};
  d.batch = batched ? a.dim(0) : 1;
  d.m = trans_a ? a.dim(-1) : a.dim(-2);
  d.k = trans_a ? a.dim(-2) : a.dim(-1);
  const int64_t kb = trans_b ? b.dim(-1) : b.dim(-2);
  d.n = trans_b ? b.dim(-2) : b.dim(-1);
  const bool ok = kb == d.k && c.dim(-2) == d.m && c.dim(-1) == d.n &&
                  (!batched || (b.dim(0) == d.batch && c.dim(0) == d.batch));
  HR_CHECK(ok, "{}: shapes do not multiply: a {}{} b {}{} c {}", op, shape_str(a.shape()), trans_a ? "^T" : "",
           shape_str(b.shape()), trans_b ? "^T" : "", shape_str(c.shape()));
  return d;
}

// fp32 copy of a float tensor (the tensor itself when it already is fp32).
Tensor as_f32(const Tensor& t) {
  if (t.dtype() == DType::f32) return t;
  Tensor w = Tensor::empty(t.device(), t.shape(), DType::f32, Consumer::workspace);
  if (t.dtype() == DType::f16)
    widen_floats(t.data_as<half_t>(), w.data_as<float>(), t.numel());
  else
    widen_floats(t.data_as<bfloat16_t>(), w.data_as<float>(), t.numel());
  return w;
}

template <typename T>
void round_into(const float* src, Tensor& dst) {
  T* d = dst.data_as<T>();
  const int64_t n = dst.numel();
  for (int64_t i = 0; i < n; ++i) d[i] = from_float<T>(src[i]);
}

void gemm_cpu(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, Tensor& c, const GemmDims& d,
              float alpha, float beta) {
  if (d.batch == 0 || d.m == 0 || d.n == 0) return;
  const Tensor a32 = as_f32(a);
  const Tensor b32 = as_f32(b);
  // c in fp32: itself, or a widened copy (only read when beta != 0).
  Tensor c32 = c;
  if (c.dtype() != DType::f32) {
    c32 = beta != 0.f ? as_f32(c) : Tensor::empty(c.device(), c.shape(), DType::f32, Consumer::workspace);
  }
  const float* A = a32.data_as<float>();
  const float* B = b32.data_as<float>();
  float* C = c32.data_as<float>();
  const int64_t mn = d.m * d.n;
  for (int64_t e = 0; e < d.batch; ++e) {
    float* Ce = C + e * mn;
    if (d.k == 0) {  // empty sum: c = beta * c (beta == 0 never reads c)
      for (int64_t i = 0; i < mn; ++i) Ce[i] = beta == 0.f ? 0.f : beta * Ce[i];
      continue;
    }
    const int lda = static_cast<int>(trans_a ? d.m : d.k);
    const int ldb = static_cast<int>(trans_b ? d.k : d.n);
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
                static_cast<int>(d.m), static_cast<int>(d.n), static_cast<int>(d.k), alpha, A + e * d.m * d.k, lda,
                B + e * d.k * d.n, ldb, beta, Ce, static_cast<int>(d.n));
  }
  if (c.dtype() == DType::f16) round_into<half_t>(C, c);
  if (c.dtype() == DType::bf16) round_into<bfloat16_t>(C, c);
}

void gemm(const char* op, const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, Tensor& c, float alpha,
          float beta, bool batched) {
  const GemmDims d = check_gemm(op, a, trans_a, b, trans_b, c, batched);
  // BLAS takes int sizes and leading dimensions.
  constexpr int64_t kIntRange = int64_t(1) << 31;
  HR_CHECK(d.m < kIntRange && d.n < kIntRange && d.k < kIntRange, "{}: dimensions beyond int range", op);
  const OpTimer timer(a, op);  // "matmul" or "matmul_batched" in an op profile
  HR_IF_CUDA(a, cuda::matmul(a, trans_a, b, trans_b, c, d.batch, d.m, d.n, d.k, alpha, beta));
  gemm_cpu(a, trans_a, b, trans_b, c, d, alpha, beta);
}

// The CPU's fused bias: every row of the fp32 y set to the bias, so that a product
// with beta = 1 adds x w^T to it. An op profile counts it as add_bias, as the bias
// add it stands for.
void set_bias_rows(Tensor& y, const Tensor& b) {
  const OpTimer timer(y, "add_bias");
  const int64_t cols = b.numel(), rows = cols == 0 ? 0 : y.numel() / cols;
  float* py = y.data_as<float>();
  if (rows == 0) return;
  dispatch_float(b.dtype(), "linear_forward bias",
                 [&](auto tag) { widen_floats(b.data_as<decltype(tag)>(), py, cols); });
  for (int64_t r = 1; r < rows; ++r) std::memcpy(py + r * cols, py, static_cast<size_t>(cols) * sizeof(float));
}

}  // namespace

void matmul(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, Tensor& c, float alpha, float beta) {
  if (const OpFault* f = op_fault("matmul"); f && (f->transpose_b || f->input_bits > 0)) {
    // The broken reads of OPS-1's controls: b the other way round, or a narrowed.
    Tensor a_read = a;
    if (f->input_bits > 0) {
      std::vector<float> v = a.to_host_f32();
      for (float& x : v) x = round_significand(x, f->input_bits);
      a_read = Tensor::from_host(a.device(), v, a.shape(), a.dtype(), Consumer::workspace);
    }
    gemm("matmul", a_read, trans_a, b, f->transpose_b ? !trans_b : trans_b, c, alpha, beta, false);
  } else {
    gemm("matmul", a, trans_a, b, trans_b, c, alpha, beta, false);
  }
  apply_output_fault("matmul", c);
}

void matmul_batched(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, Tensor& c, float alpha,
                    float beta) {
  gemm("matmul_batched", a, trans_a, b, trans_b, c, alpha, beta, true);
}

void linear_forward(const Tensor& x, const Tensor& w, const Tensor& b, Tensor& y) {
  HR_CHECK(x.defined() && w.defined() && y.defined(), "linear_forward: undefined operand");
  HR_CHECK(x.ndim() == 2 && w.ndim() == 2 && y.ndim() == 2 && x.dim(1) == w.dim(1) && y.dim(0) == x.dim(0) &&
               y.dim(1) == w.dim(0),
           "linear_forward: x {} w {} y {} (expected x [N, in], w [out, in], y [N, out])", shape_str(x.shape()),
           shape_str(w.shape()), shape_str(y.shape()));
  if (b.defined())
    HR_CHECK(b.ndim() == 1 && b.dim(0) == w.dim(0), "linear_forward: bias {} for w {}", shape_str(b.shape()),
             shape_str(w.shape()));
  if (b.defined() && y.device().kind() == BackendKind::cpu && y.dtype() == DType::f32) {
    HR_CHECK(is_float(b.dtype()), "linear_forward: bias {} must be a float tensor", b.str());
    check_same_device(y, b, "linear_forward bias");
    set_bias_rows(y, b);
    matmul(x, false, w, true, y, 1.f, 1.f);
  } else {
    matmul(x, false, w, true, y);
    if (b.defined()) add_bias(y, b);
  }
  apply_output_fault("linear_forward", y);
}

void linear_backward(const Tensor& x, const Tensor& w, const Tensor& dy, Tensor& dx, Tensor& dw, Tensor& db,
                     DxWrite dx_write) {
  HR_CHECK(x.defined() && w.defined() && dy.defined(), "linear_backward: undefined operand");
  HR_CHECK(x.ndim() == 2 && w.ndim() == 2 && dy.ndim() == 2 && x.dim(1) == w.dim(1) && dy.dim(0) == x.dim(0) &&
               dy.dim(1) == w.dim(0),
           "linear_backward: x {} w {} dy {} (expected x [N, in], w [out, in], dy [N, out])",
           shape_str(x.shape()), shape_str(w.shape()), shape_str(dy.shape()));
  if (dx.defined()) {
    check_same_shape(dx, x, "linear_backward dx");
    matmul(dy, false, w, false, dx, 1.f, dx_write == DxWrite::accumulate ? 1.f : 0.f);  // activation gradient
  }
  if (dw.defined()) {  // undefined for a frozen weight (LoRA's base): no buffer, no product
    check_same_shape(dw, w, "linear_backward dw");
    matmul(dy, true, x, false, dw, 1.f, 1.f);  // parameter gradient: accumulated
  }
  if (db.defined()) {
    HR_CHECK(db.ndim() == 1 && db.dim(0) == w.dim(0), "linear_backward: db {} for w {}", shape_str(db.shape()),
             shape_str(w.shape()));
    bias_grad(dy, db);
  }
}

}  // namespace hr::ops
