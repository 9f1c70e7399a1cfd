// A host emulation of the CUDA features the attention kernels (tensor-core and scalar:
// kernels/attention/attention_tc_kernels.cuh, attention_kernels.cuh) and the
// optimizers' kernels (kernels/optim/optim_kernels.cuh, optim8_kernels.cuh) use, so
// that their own code runs on a CPU and is checked where no GPU is: one fiber
// (Boost.Context) per CUDA thread of a block, all on the calling thread, the blocks
// one after another, so that a barrier costs user-space switches and not the host's
// scheduler (which a parallel ctest keeps busy), nor a system call (ucontext's
// swapcontext saves and restores the signal mask at each switch: 60% of these tests'
// time); __syncthreads and __syncwarp as barriers; shuffles, votes, ldmatrix and mma.sync
// m16n8k16 as warp collectives whose results are computed from the PTX ISA's
// definition of their operands ("Matrix Fragments for mma.m16n8k16 with floating point
// type", "ldmatrix"), not from the kernels' reading of it; cp.async as copies in
// groups that land when the thread waits for them, or at once (Schedule); shared
// memory, dynamic or static (HR_SHARED), as 0xff bytes at each block. A launch runs
// under a schedule, one of the orders a GPU may run a block's warps in, so that
// running a kernel under two and comparing the bits shows a missing barrier or wait.
// Addresses are checked as the hardware checks them (alignment, shared memory's
// bounds), and each ldmatrix, and each warp's cp.async writes, count the shared-memory
// wavefronts they take (bank conflicts). Faults of the emulated hardware (Fault) are
// the controls of the checks made on it. It checks the kernels' indexing, masks,
// pipelines and arithmetic; their speed and the hardware's own rounding of a product's
// sum are a GPU's to show. Include it before the kernels' header, in a host-compiled
// file: it defines HR_WARP_EMULATION, which swaps the kernels' inline assembly and
// launch code for these.
#pragma once

#if defined(__CUDACC__)
#error "warp_emulation.hpp is for host compilers: the kernels run on emulated warps"
#endif

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <boost/context/fiber.hpp>
#include <boost/context/preallocated.hpp>
#include <boost/context/stack_context.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <new>
#include <type_traits>
#include <utility>
#include <vector>

#include "kernels/common/float16.hpp"

#define HR_WARP_EMULATION 1
#ifndef __launch_bounds__
#define __launch_bounds__(...)
#endif
// A kernel's static shared memory is declared through HR_SHARED
// (kernels/common/shared_memory.cuh): storage of the block being run. A bare
// __shared__ would be a variable of each thread here, so it does not compile.
#undef __shared__
#define __shared__ static_assert(false, "declare shared memory with HR_SHARED (kernels/common/shared_memory.cuh)");
#undef __grid_constant__
#define __grid_constant__

namespace hr::warp_emu {

// Where a fault of the kernel under emulation is found: said, then fatal, as on a GPU.
[[noreturn]] inline void fail(const char* what) {
  std::fprintf(stderr, "warp emulation: %s\n", what);
  std::abort();
}

// How a launch orders a block's threads, and when its cp.async copies land. Every
// schedule is one a GPU may run, so a kernel must give the same bits under each.
struct Schedule {
  enum class Warps {
    interleaved,       // every thread in turn up to its next barrier or collective
    // Between two block barriers, warp 0 runs until each of its threads waits at
    // the next, then warp 1, and so on: every phase in the same order.
    one_at_a_time,
    one_at_a_time_reversed,  // the same, from the last warp to the first
  };
  enum class Copies {
    at_issue,  // a copy lands as it is issued: a prefetch into a tile still being read shows
    at_wait,   // a copy lands when its thread waits for its group: a read before the wait shows
  };
  Warps warps = Warps::interleaved;
  Copies copies = Copies::at_issue;
};

// Faults of the emulated hardware, for the controls of the checks run on it: a
// tensor core whose products are off, a barrier or a copy wait that lets its
// threads on, a shuffle that gives a lane its own value, threads that never run.
struct Fault {
  // Each mma.sync result element's sum of products times 1 + r, r = +-mma_rel_error
  // alternating by element.
  double mma_rel_error = 0;
  // __syncthreads that returns without waiting: the n-th of each thread of each
  // block (1-based), or every one (-1); 0: none.
  int skip_block_barrier = 0;
  // __pipeline_wait_prior that returns without waiting: the n-th of each thread of
  // each block (1-based); 0: none. Copies a thread then never waits for land as it
  // ends, so that what sees the fault is a kernel's output, not the check below.
  int skip_copy_wait = 0;
  // __shfl_xor_sync with this lane mask (or any, -1) that gives the caller its own
  // value: a broken reduction.
  int stuck_shuffle_mask = 0;
  // > 0: only the first threads_run threads of each block run, the others are lost
  // (for kernels without block barriers, which the lost ones would never reach).
  int threads_run = 0;
  // As each block barrier releases, every float of the block's static shared memory
  // (HR_SHARED arrays of float, float2 or float4; other types, such as the 8-bit
  // optimizers' codebook structs, are left alone) times 1 + r, r = +-shared_rel_error
  // alternating by element: shared memory that reads back off what was stored (for
  // kernels that stage floats between two barriers).
  double shared_rel_error = 0;
};

// What a launch did that a kernel's speed depends on.
struct LaunchStats {
  uint64_t ldmatrix = 0;             // ldmatrix .x4, a warp's each
  uint64_t ldmatrix_wavefronts = 0;  // shared-memory wavefronts they took: 4 each without bank conflicts
  // cp.async copies by the shared-memory phases their writes take: a warp's n-th
  // copies of 16 bytes in 4 phases of 8 lanes, of 8 bytes in 2 of 16, of 4 bytes in
  // 1 (128 bytes a phase), and the wavefronts those phases took (one each without
  // bank conflicts: no two distinct 4-byte words of a phase in one bank).
  uint64_t cp_async_phases = 0;
  uint64_t cp_async_wavefronts = 0;
};

// The fibers of the block being run, on this host thread.
struct Scheduler {
  // The scheduler's side of the switch: the running fiber holds it, and resumes it
  // to yield.
  boost::context::fiber main;
  std::vector<boost::context::fiber> fibers;
  std::vector<bool> done;
  int current = 0;
  uint64_t progress = 0;  // barriers released and fibers finished: a round without any is a deadlock
  const void* body = nullptr;
  void (*run_body)(const void*) = nullptr;
  Schedule schedule;
  Fault fault;
  LaunchStats stats;
  bool phase_ended = false;  // a block barrier released, one warp at a time: the next phase starts from the first warp
};
inline thread_local Scheduler* scheduler = nullptr;

// Back to the scheduler until it resumes this fiber.
inline void yield_fiber() { scheduler->main = std::move(scheduler->main).resume(); }

// What a block barrier's release does to the block's shared memory under the
// fault (Fault::shared_rel_error); defined below.
inline void on_block_release();

// n fibers meet: each but the last yields until the last releases them. A block's
// barrier, when warps run one at a time, ends the phase: the last also yields, and
// the scheduler starts the next phase from the first warp of its order.
class Barrier {
 public:
  Barrier(int n, bool block) : n_(n), block_(block) {}
  void wait() {
    const uint64_t gen = gen_;
    if (++count_ == n_) {
      count_ = 0;
      ++gen_;
      ++scheduler->progress;
      if (block_) on_block_release();
      if (block_ && scheduler->schedule.warps != Schedule::Warps::interleaved) {
        scheduler->phase_ended = true;
        yield_fiber();
      }
      return;
    }
    while (gen_ == gen) yield_fiber();
  }

 private:
  const int n_;
  const bool block_;
  int count_ = 0;
  uint64_t gen_ = 0;
};

// What the lanes of one warp exchange in a collective: up to 8 words each, in one
// of two sets by the collective's parity (one barrier a collective: a lane writes a
// set again only two collectives later, past a barrier that every lane reaches
// after reading it).
struct Warp {
  Barrier barrier{32, false};
  uint32_t words[2][32][8] = {};
  const void* address[2][32] = {};
  // An ldmatrix's 32 rows of 16 bytes, read at once by the first lane past its
  // barrier (as the hardware reads them), and which collective they are of.
  unsigned char rows[2][32][16] = {};
  unsigned rows_of[2] = {~0u, ~0u};
  // An mma.sync's A (16 x 16) and B (16 x 8) as floats, decoded once from the
  // lanes' registers by the first lane past its barrier, and which collective they
  // are of.
  float mma_a[2][16][16] = {}, mma_b[2][16][8] = {};
  unsigned mma_of[2] = {~0u, ~0u};
};

struct Block {
  explicit Block(int threads) : barrier(threads, true), warps(static_cast<size_t>((threads + 31) / 32)) {
    for (auto& w : warps) w = std::make_unique<Warp>();
  }
  Barrier barrier;
  std::vector<std::unique_ptr<Warp>> warps;
  unsigned char* smem = nullptr;
  size_t smem_bytes = 0;
  // Static shared memory (HR_SHARED), by its declaration's tag: made at the first
  // thread's use in this block, as 0xff bytes.
  struct Bytes {
    void operator()(unsigned char* p) const { ::operator delete[](p, std::align_val_t{64}); }
  };
  struct Static {
    std::unique_ptr<unsigned char[], Bytes> bytes;
    size_t size;
    bool floats;  // an array of float, float2 or float4 (Fault::shared_rel_error)
  };
  std::map<const void*, Static> statics;
  // Each cp.async's shared-memory write, by warp and by the copy's number in its
  // thread (the lanes' n-th copies are one instruction where the warp issues it
  // together), for LaunchStats::cp_async_*.
  struct CopyWrite {
    int lane;
    size_t offset;
    unsigned n;
  };
  std::map<std::pair<unsigned, unsigned>, std::vector<CopyWrite>> copy_writes;
};

// A cp.async copy a thread has issued and not yet waited for, with what it read.
struct PendingCopy {
  unsigned char* dst;
  unsigned char bytes[16];
  unsigned n;
};

// A CUDA thread: what its fiber sees as threadIdx, blockIdx, ...
struct ThreadState {
  uint3 thread{}, block{};
  dim3 grid{}, block_dim{};
  Block* blk = nullptr;
  unsigned collectives = 0;  // the warp's collectives so far: every lane runs the same ones
  int block_barriers = 0;    // __syncthreads so far
  int copy_waits = 0;        // __pipeline_wait_prior so far
  unsigned copies_issued = 0;  // cp.async so far
  std::vector<PendingCopy> copies;  // oldest first
  std::vector<size_t> groups;       // the end in `copies` of each committed group, oldest first
};
inline thread_local ThreadState* running = nullptr;  // the fiber's, set before each resume

inline int lane() { return static_cast<int>(running->thread.x % 32); }
inline Warp& warp() { return *running->blk->warps[running->thread.x / 32]; }
inline unsigned char* shared_memory() { return running->blk->smem; }

// The block's object of an HR_SHARED declaration (its tag), of type T (an array
// type or not), 0xff bytes when this block first uses it.
template <typename T>
T& static_shared(const void* tag) {
  static_assert(alignof(T) <= 64, "shared objects aligned to at most 64 bytes");
  auto& statics = running->blk->statics;
  auto it = statics.find(tag);
  if (it == statics.end()) {
    std::unique_ptr<unsigned char[], Block::Bytes> p(
        static_cast<unsigned char*>(::operator new[](sizeof(T), std::align_val_t{64})));
    std::memset(p.get(), 0xff, sizeof(T));
    using E = std::remove_all_extents_t<T>;
    constexpr bool floats = std::is_same_v<E, float> || std::is_same_v<E, float2> || std::is_same_v<E, float4>;
    it = statics.emplace(tag, Block::Static{std::move(p), sizeof(T), floats}).first;
  }
  return *reinterpret_cast<T*>(it->second.bytes.get());
}

inline void on_block_release() {
  const double r = scheduler->fault.shared_rel_error;
  if (r == 0) return;
  for (auto& [tag, st] : running->blk->statics)
    for (size_t i = 0; st.floats && i < st.size / sizeof(float); ++i) {
      float f;
      std::memcpy(&f, st.bytes.get() + i * sizeof(float), sizeof f);
      f = static_cast<float>(f * (1 + (i % 2 == 0 ? r : -r)));
      std::memcpy(st.bytes.get() + i * sizeof(float), &f, sizeof f);
    }
}

// The offset in the block's shared memory of n bytes at p, which must lie within it
// and be aligned to `align` (what ldmatrix and cp.async require).
inline size_t shared_offset(const void* p, size_t n, size_t align, const char* what) {
  const Block& blk = *running->blk;
  const auto at = reinterpret_cast<uintptr_t>(p), base = reinterpret_cast<uintptr_t>(blk.smem);
  char msg[200];
  if (at < base || at + n > base + blk.smem_bytes) {
    std::snprintf(msg, sizeof msg, "%s: %zu bytes at %+lld from shared memory's %zu, thread %u", what, n,
                  static_cast<long long>(at - base), blk.smem_bytes, running->thread.x);
    fail(msg);
  }
  if ((at - base) % align != 0) {
    std::snprintf(msg, sizeof msg, "%s: shared offset %zu is not %zu-byte aligned, thread %u", what,
                  static_cast<size_t>(at - base), align, running->thread.x);
    fail(msg);
  }
  return at - base;
}

// The warp's next collective, past its barrier: every lane has posted its part in
// the collective's set (`post(warp, set, lane)`), before the barrier.
struct Exchange {
  Warp& w;
  unsigned id, set;
  // True for the first lane past the barrier, once per collective, which works out
  // what the whole warp reads and marks it in `of` (rows_of, mma_of) as this one's.
  bool first(unsigned (&of)[2]) const {
    if (of[set] == id) return false;
    of[set] = id;
    return true;
  }
};
template <typename Post>
Exchange exchange(Post post) {
  Warp& w = warp();
  const unsigned id = running->collectives++, set = id & 1u;
  post(w, set, lane());
  w.barrier.wait();
  return {w, id, set};
}

// Every lane leaves n words; after the barrier each reads what it needs of all
// lanes' (`read(words)`, words[lane][i]).
template <typename Read>
void collective(const uint32_t* mine, int n, Read read) {
  const Exchange x = exchange([&](Warp& w, unsigned set, int L) {
    std::memcpy(w.words[set][L], mine, static_cast<size_t>(n) * 4);
  });
  read(x.w.words[x.set]);
}

inline float f32_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

template <typename T>
T shfl_xor(T v, int mask) {
  static_assert(sizeof(T) == 4, "32-bit shuffles");
  uint32_t mine;
  std::memcpy(&mine, &v, 4);
  uint32_t got = 0;
  const int stuck = scheduler->fault.stuck_shuffle_mask;
  const int from = stuck == -1 || stuck == mask ? lane() : lane() ^ mask;
  collective(&mine, 1, [&](const uint32_t(&words)[32][8]) { got = words[from][0]; });
  T out;
  std::memcpy(&out, &got, 4);
  return out;
}

// vote.sync.any: whether any lane of the warp passes a non-zero predicate.
inline int any_sync(int predicate) {
  const uint32_t mine = predicate != 0;
  uint32_t any = 0;
  collective(&mine, 1, [&](const uint32_t(&words)[32][8]) {
    for (int L = 0; L < 32; ++L) any |= words[L][0];
  });
  return static_cast<int>(any);
}

// One access of a shared-memory phase: n bytes at a shared-memory offset.
struct SharedAccess {
  size_t offset;
  unsigned n;
};

// The wavefronts a phase of shared-memory accesses takes: the most distinct 4-byte
// words that fall in one of the 32 banks (1 without a bank conflict; the same word
// twice is read or written once).
inline uint64_t phase_wavefronts(const std::vector<SharedAccess>& phase) {
  std::vector<size_t> in_bank[32];
  size_t most = 1;
  for (const SharedAccess& a : phase)
    for (size_t word = a.offset / 4; word < (a.offset + a.n) / 4; ++word) {
      std::vector<size_t>& b = in_bank[word % 32];
      if (std::find(b.begin(), b.end(), word) == b.end()) b.push_back(word);
      most = std::max(most, b.size());
    }
  return most;
}

// ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16: lanes 8i..8i+7 give the row
// addresses of matrix i (8 rows of 8 16-bit elements); lane L receives in register i
// the elements (L / 4, 2 (L % 4)) and (L / 4, 2 (L % 4) + 1) of matrix i, or with
// .trans its elements (2 (L % 4), L / 4) and (2 (L % 4) + 1, L / 4); the first in the
// low half.
// Each 8 x 8 matrix is one shared-memory phase (phase_wavefronts): one wavefront
// when its 8 rows of 16 bytes fall in different groups of 4 banks, and one more for
// each further distinct row in the most shared group.
inline void ldmatrix_x4(uint32_t (&r)[4], const void* p, bool trans) {
  const int L = lane();
  shared_offset(p, 16, 16, "ldmatrix row address");
  const Exchange x = exchange([&](Warp& w, unsigned set, int l) { w.address[set][l] = p; });
  Warp& w = x.w;
  const unsigned set = x.set;
  if (x.first(w.rows_of))  // every row at once
    for (int j = 0; j < 32; ++j) std::memcpy(w.rows[set][j], w.address[set][j], 16);
  if (L == 0) {
    LaunchStats& st = scheduler->stats;
    ++st.ldmatrix;
    const auto base = reinterpret_cast<uintptr_t>(running->blk->smem);
    for (int i = 0; i < 4; ++i) {
      std::vector<SharedAccess> rows;
      for (int j = 0; j < 8; ++j) rows.push_back({reinterpret_cast<uintptr_t>(w.address[set][8 * i + j]) - base, 16});
      st.ldmatrix_wavefronts += phase_wavefronts(rows);
    }
  }
  for (int i = 0; i < 4; ++i) {
    auto at = [&](int row, int col) {
      uint16_t e;
      std::memcpy(&e, w.rows[set][8 * i + row] + 2 * col, 2);
      return static_cast<uint32_t>(e);
    };
    const uint32_t lo = trans ? at(2 * (L % 4), L / 4) : at(L / 4, 2 * (L % 4));
    const uint32_t hi = trans ? at(2 * (L % 4) + 1, L / 4) : at(L / 4, 2 * (L % 4) + 1);
    r[i] = lo | (hi << 16);
  }
}

// A 16-bit element of a register of type M (its low or high half) as a float.
template <typename M>
float element(uint32_t reg, int high) {
  const uint16_t b = static_cast<uint16_t>(high ? reg >> 16 : reg & 0xffffu);
  if constexpr (std::is_same_v<M, __nv_bfloat16>)
    return bf16_bits_to_float(b);
  else
    return half_bits_to_float(b);
}

// mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{bf16,f16}.f32, D = A B + C:
// lane 4 g + c holds A's (g, 2c..2c+1) in a[0], (g + 8, 2c..) in a[1], (g, 2c + 8..)
// in a[2], (g + 8, 2c + 8..) in a[3]; B's (k 2c..2c+1, n g) in b0 and (k 2c + 8..,
// n g) in b1; C's and D's (g, 2c), (g, 2c + 1), (g + 8, 2c), (g + 8, 2c + 1). So A's
// (r, k) is in lane 4 (r % 8) + (k % 8) / 2, register (r >= 8) + 2 (k >= 8), half k % 2,
// and B's (k, n) in lane 4 n + (k % 8) / 2, register b0 or b1 by k >= 8, half k % 2.
// The products are exact and summed in double, then rounded once.
template <typename M>
void mma_m16n8k16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  const int L = lane(), g = L / 4, c = L % 4;
  const uint32_t mine[6] = {a[0], a[1], a[2], a[3], b0, b1};
  const Exchange x = exchange([&](Warp& w, unsigned set, int l) { std::memcpy(w.words[set][l], mine, sizeof mine); });
  Warp& w = x.w;
  const unsigned set = x.set;
  if (x.first(w.mma_of)) {  // both operands at once
    const uint32_t(&words)[32][8] = w.words[set];
    for (int r = 0; r < 16; ++r)
      for (int k = 0; k < 16; ++k)
        w.mma_a[set][r][k] = element<M>(words[4 * (r % 8) + (k % 8) / 2][(r >= 8) + 2 * (k >= 8)], k % 2);
    for (int k = 0; k < 16; ++k)
      for (int n = 0; n < 8; ++n) w.mma_b[set][k][n] = element<M>(words[4 * n + (k % 8) / 2][4 + (k >= 8)], k % 2);
  }
  const float(&A)[16][16] = w.mma_a[set];
  const float(&B)[16][8] = w.mma_b[set];
  const double r = scheduler->fault.mma_rel_error;
  for (int e = 0; e < 4; ++e) {
    const int row = g + 8 * (e >> 1), col = 2 * c + (e & 1);
    double s = 0;
    for (int k = 0; k < 16; ++k) s += static_cast<double>(A[row][k]) * B[k][col];
    d[e] = static_cast<float>(d[e] + s * (1 + (e % 2 == 0 ? r : -r)));
  }
}

// cp.async of n bytes (4, 8 or 16) from global memory into shared memory, both
// aligned to n: landed now or at the wait for its group, as the schedule says; its
// source is read now (the kernels' sources do not change while they run).
inline void copy_async(void* dst, const void* src, size_t n) {
  if (n != 4 && n != 8 && n != 16) fail("cp.async copies 4, 8 or 16 bytes");
  const size_t offset = shared_offset(dst, n, n, "cp.async destination");
  running->blk->copy_writes[{running->thread.x / 32, running->copies_issued++}].push_back(
      {lane(), offset, static_cast<unsigned>(n)});
  const auto from = reinterpret_cast<uintptr_t>(src), base = reinterpret_cast<uintptr_t>(running->blk->smem);
  if (from % n != 0) fail("cp.async source is not aligned to its size");
  if (from + n > base && from < base + running->blk->smem_bytes) fail("cp.async source is in shared memory");
  PendingCopy c{static_cast<unsigned char*>(dst), {}, static_cast<unsigned>(n)};
  std::memcpy(c.bytes, src, n);
  if (scheduler->schedule.copies == Schedule::Copies::at_issue) std::memcpy(dst, src, n);
  running->copies.push_back(c);
}

// The oldest `end` copies of t landed (where they land at the wait) and forgotten,
// with the oldest `groups` groups, which they close.
inline void land_copies(ThreadState& t, size_t end, size_t groups) {
  if (scheduler->schedule.copies == Schedule::Copies::at_wait)
    for (size_t i = 0; i < end; ++i) std::memcpy(t.copies[i].dst, t.copies[i].bytes, t.copies[i].n);
  t.copies.erase(t.copies.begin(), t.copies.begin() + static_cast<std::ptrdiff_t>(end));
  t.groups.erase(t.groups.begin(), t.groups.begin() + static_cast<std::ptrdiff_t>(groups));
  for (size_t& g : t.groups) g -= end;
}

// The copies issued since the last commit become a group.
inline void commit_copies() { running->groups.push_back(running->copies.size()); }

// Every committed group but the newest n has landed (uncommitted copies are not waited for).
inline void wait_copies(size_t n) {
  ThreadState& t = *running;
  if (++t.copy_waits == scheduler->fault.skip_copy_wait) return;
  if (t.groups.size() <= n) return;
  const size_t k = t.groups.size() - n;
  land_copies(t, t.groups[k - 1], k);
}

inline void fiber_entry() {
  scheduler->run_body(scheduler->body);
  // What the fault left waiting lands now.
  if (scheduler->fault.skip_copy_wait != 0) land_copies(*running, running->copies.size(), running->groups.size());
  if (!running->copies.empty()) {
    char msg[160];
    std::snprintf(msg, sizeof msg, "thread %u of block (%u, %u) ends with %zu cp.async copies it never waited for",
                  running->thread.x, running->block.x, running->block.y, running->copies.size());
    fail(msg);
  }
  scheduler->done[static_cast<size_t>(scheduler->current)] = true;
  ++scheduler->progress;
}

// The shared-memory phases and wavefronts of a block's cp.async writes
// (LaunchStats::cp_async_*).
inline void count_copy_wavefronts(const Block& blk, LaunchStats& st) {
  for (const auto& [key, writes] : blk.copy_writes) {
    std::map<int, std::vector<SharedAccess>> phases;  // by phase: a warp's lanes, 128 bytes a phase
    for (const Block::CopyWrite& w : writes) phases[w.lane / static_cast<int>(128 / w.n)].push_back({w.offset, w.n});
    for (const auto& [phase, accesses] : phases) {
      ++st.cp_async_phases;
      st.cp_async_wavefronts += phase_wavefronts(accesses);
    }
  }
}

// The stacks of a launch are its own, made once and used by each block's fibers in
// turn: a fiber's end frees nothing.
struct LaunchStacks {
  boost::context::stack_context allocate() { fail("a fiber asked for a stack of its own"); }
  void deallocate(boost::context::stack_context&) noexcept {}
};

// A fiber for one CUDA thread on the stack of `bytes` at `base`: it runs
// fiber_entry, then returns to the scheduler.
inline boost::context::fiber make_fiber(char* base, size_t bytes) {
  boost::context::stack_context sc;
  sc.size = bytes;
  sc.sp = base + bytes;
  return boost::context::fiber(std::allocator_arg, boost::context::preallocated(sc.sp, sc.size, sc), LaunchStacks{},
                               [](boost::context::fiber&& main) {
                                 scheduler->main = std::move(main);
                                 fiber_entry();
                                 return std::move(scheduler->main);
                               });
}

// Runs kernel() (a kernel with its arguments bound) over grid.x * grid.y blocks of
// `threads` threads with `smem_bytes` of dynamic shared memory (128-byte aligned, as
// the kernels declare it), which starts as 0xff bytes (16-bit NaNs) each block so
// that a read of what was never staged shows. The fibers of a block run as the
// schedule orders them, each until it waits at a barrier or ends; a round in which
// none gets past a barrier or ends is a deadlock (a barrier inside divergent code),
// reported and fatal rather than a hang.
template <typename Kernel>
LaunchStats launch(dim3 grid, int threads, size_t smem_bytes, Kernel kernel, Schedule schedule = {}, Fault fault = {}) {
  constexpr size_t kStackBytes = size_t{256} << 10;
  struct Aligned {
    void operator()(unsigned char* p) const { ::operator delete[](p, std::align_val_t{128}); }
  };
  // No slack past the end: a sanitizer sees a read past it.
  const std::unique_ptr<unsigned char[], Aligned> smem(
      static_cast<unsigned char*>(::operator new[](std::max<size_t>(smem_bytes, 1), std::align_val_t{128})));
  // Left uninitialised: a fiber touches only the pages of its stack it uses.
  std::vector<std::unique_ptr<char[]>> stacks(static_cast<size_t>(threads));
  for (auto& st : stacks) st.reset(new char[kStackBytes]);
  std::vector<ThreadState> states(static_cast<size_t>(threads));
  Scheduler sched;
  sched.body = &kernel;
  sched.run_body = [](const void* k) { (*static_cast<const Kernel*>(k))(); };
  sched.schedule = schedule;
  sched.fault = fault;
  Scheduler* const outer = scheduler;
  ThreadState* const outer_running = running;
  scheduler = &sched;
  const int warps = (threads + 31) / 32;
  for (unsigned by = 0; by < grid.y; ++by)
    for (unsigned bx = 0; bx < grid.x; ++bx) {
      Block blk(threads);
      std::memset(smem.get(), 0xff, smem_bytes);
      blk.smem = smem.get();
      blk.smem_bytes = smem_bytes;
      sched.fibers.clear();  // the last block's: each has ended (or never ran), so this only forgets them
      sched.done.assign(static_cast<size_t>(threads), false);
      for (int t = 0; t < threads; ++t) {
        sched.fibers.push_back(make_fiber(stacks[static_cast<size_t>(t)].get(), kStackBytes));
        ThreadState& s = states[static_cast<size_t>(t)];
        s = ThreadState{};
        s.thread = make_uint3(static_cast<unsigned>(t), 0, 0);
        s.block = make_uint3(bx, by, 0);
        s.grid = grid;
        s.block_dim = dim3(static_cast<unsigned>(threads));
        s.blk = &blk;
      }
      int live = threads;
      if (fault.threads_run > 0)
        for (int t = fault.threads_run; t < threads; ++t, --live) sched.done[static_cast<size_t>(t)] = true;
      // Resumes the live threads [t0, t1) once each, up to the end of a phase; whether
      // any got past a barrier or ended.
      auto round = [&](int t0, int t1) {
        const uint64_t before = sched.progress;
        for (int t = t0; t < t1 && !sched.phase_ended; ++t) {
          if (sched.done[static_cast<size_t>(t)]) continue;
          sched.current = t;
          running = &states[static_cast<size_t>(t)];
          sched.fibers[static_cast<size_t>(t)] = std::move(sched.fibers[static_cast<size_t>(t)]).resume();
          if (sched.done[static_cast<size_t>(t)]) --live;
        }
        return sched.progress != before;
      };
      while (live > 0) {
        bool moved = false;
        if (schedule.warps == Schedule::Warps::interleaved) {
          moved = round(0, threads);
        } else {
          sched.phase_ended = false;
          for (int i = 0; i < warps && !sched.phase_ended; ++i) {
            const int w = schedule.warps == Schedule::Warps::one_at_a_time ? i : warps - 1 - i;
            while (!sched.phase_ended && round(32 * w, std::min(threads, 32 * w + 32))) moved = true;
          }
        }
        if (live > 0 && !moved) {
          char msg[160];
          std::snprintf(msg, sizeof msg, "block (%u, %u): every live thread waits at a barrier that the others "
                                         "never reach", bx, by);
          fail(msg);
        }
      }
      count_copy_wavefronts(blk, sched.stats);
    }
  scheduler = outer;
  running = outer_running;
  return sched.stats;
}

}  // namespace hr::warp_emu

// The CUDA names the kernels use, on the emulated thread.
#define threadIdx (::hr::warp_emu::running->thread)
#define blockIdx (::hr::warp_emu::running->block)
#define gridDim (::hr::warp_emu::running->grid)
#define blockDim (::hr::warp_emu::running->block_dim)
inline void __syncthreads() {
  const int n = ++::hr::warp_emu::running->block_barriers, skip = ::hr::warp_emu::scheduler->fault.skip_block_barrier;
  if (skip == -1 || skip == n) return;
  ::hr::warp_emu::running->blk->barrier.wait();
}
inline void __syncwarp(unsigned = 0xffffffffu) { ::hr::warp_emu::warp().barrier.wait(); }
template <typename T>
T __shfl_xor_sync(unsigned, T v, int mask) {
  return ::hr::warp_emu::shfl_xor(v, mask);
}
inline int __any_sync(unsigned, int predicate) { return ::hr::warp_emu::any_sync(predicate); }
inline void __pipeline_memcpy_async(void* dst, const void* src, size_t n) { ::hr::warp_emu::copy_async(dst, src, n); }
inline void __pipeline_commit() { ::hr::warp_emu::commit_copies(); }
inline void __pipeline_wait_prior(size_t n) { ::hr::warp_emu::wait_copies(n); }
template <typename T>
T __ldg(const T* p) {
  return *p;
}
inline float __uint_as_float(unsigned u) { return ::hr::warp_emu::f32_of(u); }
inline unsigned __float_as_uint(float f) { return ::hr::warp_emu::bits_of(f); }
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
