#include "kernels/common/op_fault.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "harness/check.hpp"
#include "harness/faults.hpp"
#include "harness/tensor.hpp"

HR_DEFINE_FAULT_SLOT(hr::ops::OpFault)

namespace hr::ops {

const OpFault* op_fault(const char* op) {
  const OpFault* f = faults::active<OpFault>();
  return f && f->op == op ? f : nullptr;
}

float round_significand(float v, int bits) {
  int e = 0;
  const double m = std::frexp(static_cast<double>(v), &e);  // |m| in [0.5, 1)
  return static_cast<float>(std::ldexp(std::nearbyint(std::ldexp(m, bits + 1)), e - bits - 1));
}

void apply_output_fault(const char* op, Tensor& out) {
  const OpFault* f = op_fault(op);
  if (!f || out.numel() == 0) return;
  if (f->output_rel_error != 0) {
    std::vector<float> v = out.to_host_f32();
    for (size_t i = 0; i < v.size(); ++i)
      v[i] = static_cast<float>(v[i] * (1.0 + (i % 2 ? -f->output_rel_error : f->output_rel_error)));
    out.copy_from(Tensor::from_host(out.device(), v, out.shape(), out.dtype(), Consumer::workspace));
  }
  if (f->flip_on_call > 0 && static_cast<int64_t>(++faults::slot<OpFault>().uses) == f->flip_on_call) {
    std::vector<uint8_t> bytes = out.to_host_bytes();
    const size_t width = dtype_size(out.dtype());
    const size_t bit = static_cast<size_t>(std::clamp(f->flip_bit, 0, static_cast<int>(width * 8) - 1));
    const size_t at = static_cast<size_t>(out.numel() / 2) * width;
    bytes[at + bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));  // little-endian: bit 0 is the lowest
    out.from_host_bytes(bytes.data(), bytes.size());
  }
  if (f->unstable_elements > 0 && faults::slot<OpFault>().uses++ % 2 == 1) {
    std::vector<uint8_t> bytes = out.to_host_bytes();
    const size_t width = dtype_size(out.dtype());
    HR_CHECK(width == 2 || width == 4, "{}: an unstable-output fault needs 16- or 32-bit elements", op);
    const int64_t n = std::min<int64_t>(f->unstable_elements, out.numel());
    for (int64_t i = 0; i < n; ++i) {
      uint8_t* p = bytes.data() + i * width;
      if (width == 2) {
        uint16_t u;
        std::memcpy(&u, p, 2);
        ++u;
        std::memcpy(p, &u, 2);
      } else {
        uint32_t u;
        std::memcpy(&u, p, 4);
        ++u;
        std::memcpy(p, &u, 4);
      }
    }
    out.from_host_bytes(bytes.data(), bytes.size());
  }
}

}  // namespace hr::ops
