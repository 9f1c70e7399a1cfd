// Run-time dtype -> storage type dispatch for op entry points (plain C++ and CUDA
// translation units alike): the op body is written once as a generic lambda over
// the storage type, and a non-float dtype is an error naming the op.
#pragma once

#include "harness/check.hpp"
#include "harness/dtype.hpp"
#include "kernels/common/float16.hpp"

namespace hr {

// Calls f(T{}) with T = float, half_t or bfloat16_t for dtype t.
template <typename F>
auto dispatch_float(DType t, const char* op, F&& f) {
  switch (t) {
    case DType::f32: return f(float{});
    case DType::f16: return f(half_t{});
    case DType::bf16: return f(bfloat16_t{});
    default: break;
  }
  throw Error(fmt::format("{}: dtype {} is not a float dtype (fp32, fp16 or bf16)", op, dtype_name(t)));
}

// Two dtypes at once (casts, mixed-precision accumulation): f(A{}, B{}).
template <typename F>
auto dispatch_float2(DType a, DType b, const char* op, F&& f) {
  return dispatch_float(a, op, [&](auto ta) {
    return dispatch_float(b, op, [&](auto tb) { return f(ta, tb); });
  });
}

}  // namespace hr
