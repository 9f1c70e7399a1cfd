// Many tensors in one kernel launch (the optimizers' many-tensor steps): each
// tensor's elements in pieces of a fixed size, a thread block a piece, the pieces
// numbered across the launch's tensors. A launch's parameters are a
// ManyTensorLaunch, passed by value (__grid_constant__) within the 4 KiB of kernel
// parameters every driver takes; each block finds its tensor by a binary search of
// the pieces' starts, and the host packs the tensors into as few launches as the
// per-launch count and an int piece index allow.
#pragma once

#include <cstdint>
#include <limits>
#include <vector>

#include "harness/check.hpp"
#include "kernels/common/hd.hpp"

namespace hr::gpu {

template <typename Arg, int kMax>
struct ManyTensorLaunch {
  static constexpr int kMaxTensors = kMax;
  Arg t[kMax];
  int start[kMax + 1];  // tensor k's pieces: [start[k], start[k + 1])
  int count;
};

// The tensor of piece `piece`: the last whose first piece is at or before it.
template <typename Launch>
HR_HD int tensor_of(const Launch& L, int piece) {
  int lo = 0, hi = L.count - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (L.start[mid] <= piece) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

// Packs tensors (each Arg with its element count `n`) into launches of pieces of
// `piece` elements, calling launch(L) for each full one and the last (the grid is
// L.start[L.count] blocks). Empty tensors take no piece. `op` names the caller in
// the error of a tensor whose pieces an int cannot count.
template <typename Launch, typename Arg, typename Fn>
void for_each_launch(const std::vector<Arg>& ts, int64_t piece, const char* op, Fn&& launch) {
  Launch L{};
  auto flush = [&] {
    if (L.count == 0) return;
    launch(static_cast<const Launch&>(L));
    L = Launch{};
  };
  for (const Arg& a : ts) {
    if (a.n == 0) continue;
    const int64_t pieces = (a.n + piece - 1) / piece;
    HR_CHECK(pieces < std::numeric_limits<int>::max(), "{}: {} elements in one tensor", op, a.n);
    if (L.count == Launch::kMaxTensors || L.start[L.count] + pieces > std::numeric_limits<int>::max()) flush();
    L.t[L.count] = a;
    L.start[L.count + 1] = L.start[L.count] + static_cast<int>(pieces);
    ++L.count;
  }
  flush();
}

}  // namespace hr::gpu
