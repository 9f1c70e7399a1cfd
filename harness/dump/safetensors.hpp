// A safetensors writer (https://github.com/huggingface/safetensors format):
// 8-byte little-endian header length, a JSON header mapping each tensor name to
// {dtype, shape, data_offsets [begin, end)} relative to the data section (plus an
// optional "__metadata__" string map), padded with spaces to a multiple of 8,
// then the raw little-endian bytes of every tensor, contiguous, in the order given.
// Written to a temporary file and renamed, so a reader never sees half a file.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "harness/tensor.hpp"

namespace hr {

struct SafetensorsEntry {
  std::string name;
  std::string dtype;  // "F64", "F32", "F16", "BF16", "I32", "U8"
  Shape shape;
  std::vector<uint8_t> bytes;
};

// The safetensors dtype name of a tensor dtype ("F32", "F16", "BF16", "I32", "U8").
const char* safetensors_dtype(DType t);
// An entry holding a device tensor's bytes (copied to the host).
SafetensorsEntry safetensors_entry(const std::string& name, const Tensor& t);
SafetensorsEntry safetensors_scalar_f64(const std::string& name, double v);

// Throws Error naming the path when it cannot be written, InvalidArgument on a
// duplicate name or a size that does not match dtype and shape.
void write_safetensors(const std::string& path, const std::vector<SafetensorsEntry>& entries,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace hr
