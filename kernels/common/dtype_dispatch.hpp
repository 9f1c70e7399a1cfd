// Run-time dtype -> compile-time storage type: calls fn(T{}) with T the storage type
// of a float dtype (float, half_t, bfloat16_t), so one templated loop or launch
// serves fp32 / fp16 / bf16. Usable from .cpp and from the host side of .cu files.
#pragma once

#include "harness/check.hpp"
#include "harness/dtype.hpp"
#include "kernels/common/float16.hpp"

namespace hr {

template <typename Fn>
decltype(auto) dispatch_float(DType t, const char* what, Fn&& fn) {
  switch (t) {
    case DType::f32: return fn(float{});
    case DType::f16: return fn(half_t{});
    case DType::bf16: return fn(bfloat16_t{});
    default: break;
  }
  throw Error(fmt::format("{}: dtype {} is not a float dtype", what, dtype_name(t)));
}

// Two dtypes at once (casts, mixed-precision accumulation): calls fn(A{}, B{}).
template <typename Fn>
decltype(auto) dispatch_float2(DType a, DType b, const char* what, Fn&& fn) {
  return dispatch_float(a, what, [&](auto ta) -> decltype(auto) {
    return dispatch_float(b, what, [&](auto tb) -> decltype(auto) { return fn(ta, tb); });
  });
}

}  // namespace hr
