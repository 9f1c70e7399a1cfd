// The attention problems the emulated kernel tests share (the tensor-core kernels
// and the scalar ones on emulated warps): a shape under one of the masks, inputs as
// stored in a dtype, and the float64 gradient of sum(out * dout) computed from the
// definition (P, dV = P^T dO, dS = P (dP - rowsum(P dP)), dQ = scale dS K,
// dK = scale dS^T Q) with its own mask predicate, apart from every kernel's.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "harness/dtype.hpp"
#include "kernels/common/float16.hpp"
#include "suites/common/attention_masks.hpp"
#include "suites/common/test_support.hpp"

namespace hr::test::attn {

using hr::DType;
using Mask = MaskKind;

struct Problem {
  int B, H, T, D;
  float scale;
  bool causal = false;
  std::vector<int32_t> kv_len;  // [B] or empty
  std::vector<int32_t> seg;     // [B, T] or empty
};

inline Problem make_problem(int B, int H, int T, int D, Mask mk) {
  Problem p{B, H, T, D, 1.f / std::sqrt(static_cast<float>(D))};
  p.causal = hr::test::is_causal(mk);
  if (hr::test::has_key_lengths(mk))
    for (int b = 0; b < B; ++b) p.kv_len.push_back(b % 2 == 0 ? T - 1 : T / 2 + 3);  // one key short, about half
  if (hr::test::has_segments(mk)) {
    const int lens[] = {37, 5, 70, 1, 19};  // documents across the 64-row tiles
    for (int b = 0; b < B; ++b) {
      int id = 0, used = 0, li = b;
      for (int t = 0; t < T; ++t) {
        if (used == lens[li % 5]) ++id, ++li, used = 0;
        p.seg.push_back(id);
        ++used;
      }
    }
  }
  return p;
}

// Whether query t of batch row b sees key s: the masks' definitions, written here
// apart from the kernels' predicate.
inline bool visible(const Problem& p, int b, int t, int s) {
  if (p.causal && s > t) return false;
  if (!p.kv_len.empty() && s >= p.kv_len[static_cast<size_t>(b)]) return false;
  if (!p.seg.empty() && p.seg[static_cast<size_t>(b * p.T + s)] != p.seg[static_cast<size_t>(b * p.T + t)])
    return false;
  return true;
}

struct Grads {
  std::vector<double> dq, dk, dv;
  double max_ds = 0;  // the largest |P (dP - rowsum(P dP))|, before the scale
};

// The float64 gradient of sum(out * dout) from the definition, per head.
inline Grads reference_backward(const Problem& p, const std::vector<double>& q, const std::vector<double>& k,
                         const std::vector<double>& v, const std::vector<double>& dout) {
  const int T = p.T, D = p.D;
  Grads g{std::vector<double>(q.size()), std::vector<double>(q.size()), std::vector<double>(q.size())};
  std::vector<double> P(static_cast<size_t>(T) * T), dP(static_cast<size_t>(T) * T);
  for (int bh = 0; bh < p.B * p.H; ++bh) {
    const int b = bh / p.H;
    const size_t o = static_cast<size_t>(bh) * T * D;
    auto at = [&](const std::vector<double>& x, int row, int d) { return x[o + static_cast<size_t>(row) * D + d]; };
    for (int t = 0; t < T; ++t) {
      double mx = -INFINITY;
      for (int s = 0; s < T; ++s) {
        double sc = -INFINITY;
        if (visible(p, b, t, s)) {
          sc = 0;
          for (int d = 0; d < D; ++d) sc += at(q, t, d) * at(k, s, d);
          sc *= p.scale;
        }
        P[static_cast<size_t>(t) * T + s] = sc;
        mx = std::max(mx, sc);
      }
      double sum = 0;
      for (int s = 0; s < T; ++s) {
        double& x = P[static_cast<size_t>(t) * T + s];
        x = x == -INFINITY ? 0.0 : std::exp(x - mx);
        sum += x;
      }
      for (int s = 0; s < T; ++s) P[static_cast<size_t>(t) * T + s] = sum > 0 ? P[static_cast<size_t>(t) * T + s] / sum : 0.0;
      double row = 0;
      for (int s = 0; s < T; ++s) {
        double x = 0;
        for (int d = 0; d < D; ++d) x += at(dout, t, d) * at(v, s, d);
        dP[static_cast<size_t>(t) * T + s] = x;
        row += x * P[static_cast<size_t>(t) * T + s];
      }
      for (int s = 0; s < T; ++s) {
        const double pts = P[static_cast<size_t>(t) * T + s];
        const double ds = pts * (dP[static_cast<size_t>(t) * T + s] - row);
        g.max_ds = std::max(g.max_ds, std::fabs(ds));
        for (int d = 0; d < D; ++d) {
          g.dq[o + static_cast<size_t>(t) * D + d] += p.scale * ds * at(k, s, d);
          g.dk[o + static_cast<size_t>(s) * D + d] += p.scale * ds * at(q, t, d);
          g.dv[o + static_cast<size_t>(s) * D + d] += pts * at(dout, t, d);
        }
      }
    }
  }
  return g;
}

// Values drawn in [-spread, spread), none zero, as stored in the dtype (fp32, fp16
// or bf16), and widened.
struct Input {
  DType dt;
  std::vector<unsigned char> bytes;
  std::vector<double> values;
  template <typename S>
  const S* as() const {
    return reinterpret_cast<const S*>(bytes.data());
  }
};
inline Input random_input(size_t n, uint64_t seed, DType dt, float spread = 1.f) {
  Input x{dt, std::vector<unsigned char>(n * hr::dtype_size(dt)), {}};
  size_t i = 0;
  for (float f : hr::test::random_nonzero(n, seed, -spread, spread)) {
    unsigned char* at = x.bytes.data() + i++ * hr::dtype_size(dt);
    if (dt == DType::f32) {
      std::memcpy(at, &f, 4);
      x.values.push_back(f);
      continue;
    }
    const uint16_t b = dt == DType::f16 ? hr::float_to_half_bits(f) : hr::float_to_bf16_bits(f);
    std::memcpy(at, &b, 2);
    x.values.push_back(dt == DType::f16 ? hr::half_bits_to_float(b) : hr::bf16_bits_to_float(b));
  }
  return x;
}

// Elements of `dt` stored in `bytes`, widened to float.
inline std::vector<float> widen(const std::vector<unsigned char>& bytes, DType dt) {
  const size_t w = hr::dtype_size(dt), n = bytes.size() / w;
  std::vector<float> out(n);
  for (size_t i = 0; i < n; ++i) {
    if (dt == DType::f32) {
      std::memcpy(&out[i], bytes.data() + i * 4, 4);
      continue;
    }
    uint16_t b;
    std::memcpy(&b, bytes.data() + i * 2, 2);
    out[i] = dt == DType::f16 ? hr::half_bits_to_float(b) : hr::bf16_bits_to_float(b);
  }
  return out;
}

}  // namespace hr::test::attn
