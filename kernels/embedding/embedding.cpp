// Token + position embedding: argument checks (ids and positions are range-checked
// on the host, so a bad id throws instead of reading out of bounds), backend
// dispatch and the CPU loops. The backward sums per id in token order through the
// inverse index, the same order as the CUDA kernel, with no atomics.
#include "kernels/embedding/embedding.hpp"

#include <algorithm>
#include <initializer_list>
#include <vector>

#include "harness/check.hpp"
#include "kernels/common/dispatch.hpp"
#include "kernels/common/dtype_dispatch.hpp"
#include "kernels/common/host_ints.hpp"
#include "kernels/embedding/embedding_math.hpp"
#if HEADROOM_HAVE_CUDA
#include "kernels/embedding/embedding_cuda.hpp"
#endif

namespace hr::ops {
namespace {

void check_ids(const Tensor& ids, const Tensor& pos, const char* op) {
  HR_CHECK(ids.defined() && ids.dtype() == DType::i32 && ids.ndim() == 2, "{}: ids must be int32 [B, T], got {}", op,
           ids.str());
  HR_CHECK(pos.defined() && pos.dtype() == DType::i32 && pos.shape() == ids.shape(),
           "{}: pos must be int32 {}, got {}", op, shape_str(ids.shape()), pos.str());
  check_same_device(ids, pos, op);
}

// Checks that every id lies in [0, n).
void check_range(const HostInts& v, int64_t n, const char* op, const char* what) {
  for (size_t i = 0; i < v.size(); ++i)
    HR_CHECK(v[i] >= 0 && v[i] < n, "{}: {}[{}] = {} outside [0, {})", op, what, i, v[i], n);
}

template <typename T>
void forward_cpu(const HostInts& ids, const HostInts& pos, const Tensor& wte, const Tensor& wpe, Tensor& out) {
  const int64_t C = wte.dim(1);
  const T* tp = wte.data_as<T>();
  const T* pp = wpe.data_as<T>();
  T* op = out.data_as<T>();
  for (size_t i = 0; i < ids.size(); ++i) {
    const T* tr = tp + static_cast<int64_t>(ids[i]) * C;
    const T* pr = pp + static_cast<int64_t>(pos[i]) * C;
    T* orow = op + static_cast<int64_t>(i) * C;
    for (int64_t c = 0; c < C; ++c) orow[c] = from_float<T>(emb::combine(to_float(tr[c]), to_float(pr[c])));
  }
}

template <typename D>
void backward_rows_cpu(const emb::InverseIndex& ix, const Tensor& dout, Tensor& dw) {
  const int64_t C = dw.dim(1);
  const D* dp = dout.data_as<D>();
  float* wp = dw.data_as<float>();
  std::vector<float> acc(static_cast<size_t>(C));
  for (size_t k = 0; k < ix.ids.size(); ++k) {
    std::fill(acc.begin(), acc.end(), 0.f);
    for (int32_t j = ix.offsets[k]; j < ix.offsets[k + 1]; ++j) {
      const D* row = dp + static_cast<int64_t>(ix.tokens[static_cast<size_t>(j)]) * C;
      for (int64_t c = 0; c < C; ++c) acc[c] += to_float(row[c]);
    }
    float* w = wp + static_cast<int64_t>(ix.ids[k]) * C;
    for (int64_t c = 0; c < C; ++c) w[c] += acc[c];
  }
}

void backward_rows(const emb::InverseIndex& ix, const Tensor& dout, Tensor& dw) {
  HR_IF_CUDA(dout, cuda::embedding_backward_rows(ix, dout, dw));
  dispatch_float(dout.dtype(), "embedding_backward",
                 [&](auto tag) { backward_rows_cpu<decltype(tag)>(ix, dout, dw); });
}

}  // namespace

void embedding_forward(const Tensor& ids, const Tensor& pos, const Tensor& wte, const Tensor& wpe, Tensor& out,
                       const EmbeddingHostIds& host) {
  const char* op = "embedding_forward";
  check_ids(ids, pos, op);
  HR_CHECK(wte.defined() && wte.ndim() == 2 && is_float(wte.dtype()), "{}: wte must be [V, C], got {}", op,
           wte.str());
  const int64_t C = wte.dim(1);
  HR_CHECK(wpe.defined() && wpe.ndim() == 2 && wpe.dim(1) == C && wpe.dtype() == wte.dtype(),
           "{}: wpe must be {} [Tmax, {}], got {}", op, dtype_name(wte.dtype()), C, wpe.str());
  const Shape out_shape{ids.dim(0), ids.dim(1), C};  // not inside HR_CHECK: its condition text is a format string
  HR_CHECK(out.defined() && out.shape() == out_shape && out.dtype() == wte.dtype(),
           "{}: out must be {} [{}, {}, {}], got {}", op, dtype_name(wte.dtype()), ids.dim(0), ids.dim(1), C,
           out.str());
  for (const Tensor* t : std::initializer_list<const Tensor*>{&wte, &wpe, &out}) check_same_device(ids, *t, op);
  const HostInts hid(ids, host.ids, op), hpos(pos, host.pos, op);
  check_range(hid, wte.dim(0), op, "ids");
  check_range(hpos, wpe.dim(0), op, "pos");
  if (out.numel() == 0) return;
  HR_IF_CUDA(ids, cuda::embedding_forward(ids, pos, wte, wpe, out));
  dispatch_float(wte.dtype(), op, [&](auto tag) { forward_cpu<decltype(tag)>(hid, hpos, wte, wpe, out); });
}

void embedding_backward(const Tensor& ids, const Tensor& pos, const Tensor& dout, Tensor& dwte, Tensor& dwpe,
                        const EmbeddingHostIds& host) {
  const char* op = "embedding_backward";
  check_ids(ids, pos, op);
  const OpTimer timer(ids, op);  // the host's index of rows included
  HR_CHECK(dwte.defined() && dwte.ndim() == 2 && dwte.dtype() == DType::f32, "{}: dwte must be fp32 [V, C], got {}",
           op, dwte.str());
  const int64_t C = dwte.dim(1);
  HR_CHECK(dwpe.defined() && dwpe.ndim() == 2 && dwpe.dim(1) == C && dwpe.dtype() == DType::f32,
           "{}: dwpe must be fp32 [Tmax, {}], got {}", op, C, dwpe.str());
  const Shape dout_shape{ids.dim(0), ids.dim(1), C};
  HR_CHECK(dout.defined() && is_float(dout.dtype()) && dout.shape() == dout_shape,
           "{}: dout must be [{}, {}, {}], got {}", op, ids.dim(0), ids.dim(1), C, dout.str());
  for (const Tensor* t : std::initializer_list<const Tensor*>{&dout, &dwte, &dwpe}) check_same_device(ids, *t, op);
  const HostInts hid(ids, host.ids, op), hpos(pos, host.pos, op);
  check_range(hid, dwte.dim(0), op, "ids");
  check_range(hpos, dwpe.dim(0), op, "pos");
  if (dout.numel() == 0) return;
  backward_rows(emb::build_inverse_index(hid.to_vector(), dwte.dim(0)), dout, dwte);
  backward_rows(emb::build_inverse_index(hpos.to_vector(), dwpe.dim(0)), dout, dwpe);
}

}  // namespace hr::ops
