// Dropout keying and replay (see dropout_keys.hpp). The per_sample scheme draws
// each sample's rows with the existing dropout kernel at that sample's draw index,
// so both backends agree bit for bit without a kernel of their own.
#include "harness/step/dropout_keys.hpp"

#include "harness/check.hpp"
#include "kernels/common/philox.hpp"
#include "kernels/dropout/dropout.hpp"

namespace hr {

const char* dropout_keying_name(DropoutKeying k) {
  return k == DropoutKeying::per_sample ? "per_sample" : "running_offset";
}

DropoutKeying parse_dropout_keying(const std::string& s) {
  if (s == "per_sample") return DropoutKeying::per_sample;
  if (s == "running_offset") return DropoutKeying::running_offset;
  throw InvalidArgument(fmt::format("dropout_keying: unknown '{}' (expected per_sample or running_offset)", s));
}

namespace {
constexpr int kSampleBits = 32, kSiteBits = 48;
}  // namespace

DropoutDraw DropoutStream::take(int64_t block, DropoutSite kind, const Shape& shape, int64_t samples) {
  DropoutDraw d;
  d.keying = keying;
  d.flip = flip_next;
  flip_next = 0;
  const int64_t numel = shape_numel(shape);
  if (keying == DropoutKeying::running_offset) {
    d.key = seed;
    d.first = offset;
    d.samples = 1;
    offset += philox_advance(static_cast<uint64_t>(numel));
  } else {
    HR_CHECK(samples > 0 && !shape.empty() && shape[0] % samples == 0,
             "dropout: {} samples do not split dim 0 of {}", samples, shape_str(shape));
    const int64_t site = block * kDropoutSitesPerBlock + static_cast<int64_t>(kind);
    HR_CHECK(numel / samples < (int64_t{1} << kSampleBits) && sample0 + samples <= (int64_t{1} << (kSiteBits - kSampleBits)) &&
                 site < (int64_t{1} << (64 - kSiteBits)),
             "dropout: site {} / samples [{}, {}) / {} elements per sample exceed the per_sample key's fields",
             site, sample0, sample0 + samples, numel / samples);
    d.key = seed + pass * kDropoutPassKeyStep;
    if (fresh) d.key ^= kDropoutFreshKeyXor;
    d.first = (static_cast<uint64_t>(site) << kSiteBits) | (static_cast<uint64_t>(sample0) << kSampleBits);
    d.samples = samples;
  }
  if (log != nullptr) {
    d.log = log;
    d.log_index = log->size();
    log->push_back({block, static_cast<int64_t>(kind), shape, d});
  }
  return d;
}

namespace {

// The element flip of the subtle fault: elements [0, flip) of the first sample
// take the other decision. A fault path, done on the host.
// `xs` is the input as it was before the mask was applied (y may be x).
void flip_elements(const DropoutDraw& d, float p, const std::vector<float>& xs, Tensor& y) {
  const int64_t n = std::min<int64_t>(d.flip, y.numel() / d.samples);
  Tensor keep = Tensor::empty(y.device(), {n}, DType::u8, Consumer::workspace);
  ops::dropout_mask(n, p, d.key, d.first, keep);
  const std::vector<uint8_t> k = keep.to_host_bytes();
  std::vector<float> ys = y.to_host_f32();
  for (int64_t i = 0; i < n; ++i)
    ys[static_cast<size_t>(i)] = k[static_cast<size_t>(i)] ? 0.f : xs[static_cast<size_t>(i)] * (1.f / (1.f - p));
  y.copy_from(Tensor::from_host(y.device(), ys, y.shape(), y.dtype(), Consumer::workspace));
}

template <typename Fn>
void per_sample(const DropoutDraw& d, const Tensor& x, Tensor& y, Fn&& fn) {
  if (d.keying == DropoutKeying::running_offset) {
    fn(x, d.first, y);
    return;
  }
  const int64_t rows = x.dim(0) / d.samples;
  for (int64_t b = 0; b < d.samples; ++b) {
    Tensor ys = y.slice(b * rows, (b + 1) * rows);
    fn(x.slice(b * rows, (b + 1) * rows), d.first + (static_cast<uint64_t>(b) << kSampleBits), ys);
  }
}

}  // namespace

void dropout_apply_forward(const DropoutDraw& d, float p, const Tensor& x, Tensor& y) {
  const bool record = d.log != nullptr && d.log_index < d.log->size();
  const std::vector<float> before = d.flip > 0 || record ? x.to_host_f32() : std::vector<float>{};
  per_sample(d, x, y, [&](const Tensor& xs, uint64_t off, Tensor& ys) { ops::dropout_forward(xs, p, d.key, off, ys); });
  if (d.flip > 0) flip_elements(d, p, before, y);
  if (record) {
    // FNV-1a over (index, kept) of every element with a non-zero input.
    const std::vector<float> after = y.to_host_f32();
    uint64_t h = 0xcbf29ce484222325ull;
    int64_t n = 0;
    auto mix = [&](uint64_t v) {
      for (int b = 0; b < 8; ++b) h = (h ^ ((v >> (8 * b)) & 0xffu)) * 0x100000001b3ull;
    };
    for (size_t i = 0; i < before.size(); ++i) {
      if (before[i] == 0.f) continue;
      mix((static_cast<uint64_t>(i) << 1) | (after[i] != 0.f ? 1u : 0u));
      ++n;
    }
    DropoutRecord& r = (*d.log)[d.log_index];
    r.applied = true;
    r.applied_hash = h;
    r.applied_elements = n;
  }
}

void dropout_apply_backward(const DropoutDraw& d, float p, const Tensor& dy, Tensor& dx) {
  const std::vector<float> before = d.flip > 0 ? dy.to_host_f32() : std::vector<float>{};
  per_sample(d, dy, dx,
             [&](const Tensor& gs, uint64_t off, Tensor& out) { ops::dropout_backward(gs, p, d.key, off, out); });
  if (d.flip > 0) flip_elements(d, p, before, dx);
}

void dropout_draw_mask(const DropoutDraw& d, float p, Tensor& mask_u8) {
  per_sample(d, mask_u8, mask_u8, [&](const Tensor&, uint64_t off, Tensor& ms) {
    Tensor flat = ms.reshape({ms.numel()});
    ops::dropout_mask(ms.numel(), p, d.key, off, flat);
  });
  if (d.flip > 0) {
    const int64_t n = std::min<int64_t>(d.flip, mask_u8.numel() / d.samples);
    std::vector<uint8_t> b = mask_u8.to_host_bytes();
    for (int64_t i = 0; i < n; ++i) b[static_cast<size_t>(i)] ^= 1u;
    mask_u8.from_host_bytes(b.data(), b.size());
  }
}

}  // namespace hr
