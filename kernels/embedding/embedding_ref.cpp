// Float64 embedding reference: a gather forward and a scatter-add backward.
#include "kernels/embedding/embedding_ref.hpp"

#include <cstddef>

namespace hr::ref {

void embedding_forward(const std::vector<int32_t>& ids, const std::vector<int32_t>& pos, const vecd& wte,
                       const vecd& wpe, int64_t C, vecd& out) {
  out.assign(ids.size() * static_cast<size_t>(C), 0.0);
  for (size_t i = 0; i < ids.size(); ++i)
    for (int64_t c = 0; c < C; ++c)
      out[i * C + c] = wte[static_cast<size_t>(ids[i] * C + c)] + wpe[static_cast<size_t>(pos[i] * C + c)];
}

void embedding_backward(const std::vector<int32_t>& ids, const std::vector<int32_t>& pos, const vecd& dout,
                        int64_t V, int64_t P, int64_t C, vecd& dwte, vecd& dwpe) {
  dwte.assign(static_cast<size_t>(V * C), 0.0);
  dwpe.assign(static_cast<size_t>(P * C), 0.0);
  for (size_t i = 0; i < ids.size(); ++i)
    for (int64_t c = 0; c < C; ++c) {
      dwte[static_cast<size_t>(ids[i] * C + c)] += dout[i * C + c];
      dwpe[static_cast<size_t>(pos[i] * C + c)] += dout[i * C + c];
    }
}

}  // namespace hr::ref
