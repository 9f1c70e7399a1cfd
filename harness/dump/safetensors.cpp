// safetensors writer (see safetensors.hpp). Host byte order is little-endian on
// every platform headroom builds for (x86-64, aarch64); checked at compile time.
#include "harness/dump/safetensors.hpp"

#include <nlohmann/json.hpp>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <set>

#include "harness/check.hpp"
#include "harness/output.hpp"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "safetensors data is little-endian");

namespace hr {

const char* safetensors_dtype(DType t) {
  switch (t) {
    case DType::f32: return "F32";
    case DType::f16: return "F16";
    case DType::bf16: return "BF16";
    case DType::i32: return "I32";
    case DType::u8: return "U8";
  }
  return "?";
}

namespace {
size_t element_size(const std::string& dtype) {
  if (dtype == "F64" || dtype == "I64") return 8;
  if (dtype == "F32" || dtype == "I32") return 4;
  if (dtype == "F16" || dtype == "BF16" || dtype == "I16") return 2;
  if (dtype == "U8" || dtype == "I8" || dtype == "BOOL") return 1;
  throw InvalidArgument(fmt::format("safetensors: unknown dtype '{}'", dtype));
}
}  // namespace

SafetensorsEntry safetensors_entry(const std::string& name, const Tensor& t) {
  return SafetensorsEntry{name, safetensors_dtype(t.dtype()), t.shape(), t.to_host_bytes()};
}

SafetensorsEntry safetensors_scalar_f64(const std::string& name, double v) {
  SafetensorsEntry e{name, "F64", {}, std::vector<uint8_t>(8)};
  std::memcpy(e.bytes.data(), &v, 8);
  return e;
}

void write_safetensors(const std::string& path, const std::vector<SafetensorsEntry>& entries,
                       const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::set<std::string> names;
  uint64_t offset = 0;
  for (const SafetensorsEntry& e : entries) {
    HR_ARG_CHECK(e.name != "__metadata__" && names.insert(e.name).second, "safetensors: duplicate or reserved name '{}'",
                 e.name);
    const uint64_t want = static_cast<uint64_t>(shape_numel(e.shape)) * element_size(e.dtype);
    HR_ARG_CHECK(want == e.bytes.size(), "safetensors: '{}' has {} bytes, {} {} needs {}", e.name, e.bytes.size(),
                 e.dtype, shape_str(e.shape), want);
    header[e.name] = {{"dtype", e.dtype}, {"shape", e.shape}, {"data_offsets", {offset, offset + want}}};
    offset += want;
  }
  std::string h = header.dump();
  h.append((8 - h.size() % 8) % 8, ' ');  // the data section starts 8-byte aligned
  const uint64_t hlen = h.size();
  uint8_t len_bytes[8];
  for (int i = 0; i < 8; ++i) len_bytes[i] = static_cast<uint8_t>(hlen >> (8 * i));

  OutputFile out(path);
  out.write(len_bytes, 8);
  out.write(h);
  for (const SafetensorsEntry& e : entries) out.write(e.bytes.data(), e.bytes.size());
  out.commit();
}

}  // namespace hr
