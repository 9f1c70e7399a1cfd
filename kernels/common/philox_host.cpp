#include "kernels/common/philox_host.hpp"

HR_DEFINE_FAULT_SLOT(hr::PhiloxFault)

namespace hr {

std::vector<uint32_t> philox_host_draws(uint64_t seed, uint64_t offset, size_t n) {
  const PhiloxFault* f = faults::active<PhiloxFault>();
  std::vector<uint32_t> out(n);
  for (size_t i = 0; i < n; ++i) {
    const uint64_t d = offset + i;
    if (f && f->naive_counter_order) {
      const uint64_t block = d >> 2;
      const Philox4 r = philox4x32_10(Philox4{static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32), 0u, 0u},
                                      static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
      const uint32_t w[4] = {r.x, r.y, r.z, r.w};
      out[i] = w[d & 3u];
    } else {
      out[i] = philox_draw(seed, d);
    }
  }
  if (f && f->flip_draw >= 0 && static_cast<size_t>(f->flip_draw) < n)
    out[static_cast<size_t>(f->flip_draw)] ^= f->flip_mask;
  return out;
}

Philox4 philox4x32_10_host(Philox4 ctr, uint32_t k0, uint32_t k1) {
  Philox4 r = philox4x32_10(ctr, k0, k1);
  if (const PhiloxFault* f = faults::active<PhiloxFault>(); f && f->flip_draw >= 0) {
    uint32_t* w[4] = {&r.x, &r.y, &r.z, &r.w};
    *w[f->flip_draw % 4] ^= f->flip_mask;
  }
  return r;
}

}  // namespace hr
