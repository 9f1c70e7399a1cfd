// Storage data types of tensors. Compute is always fp32 (fp32 accumulation);
// fp16 and bf16 are storage formats that round on every store.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace hr {

enum class DType : uint8_t { f32, f16, bf16, i32, u8 };

size_t dtype_size(DType t);
const char* dtype_name(DType t);       // "fp32", "fp16", "bf16", "int32", "uint8"
DType parse_dtype(const std::string&);  // throws InvalidArgument naming the accepted values
bool is_float(DType t);

// The floating dtypes every property and op runs over.
inline constexpr DType kFloatDTypes[] = {DType::f32, DType::f16, DType::bf16};

}  // namespace hr
