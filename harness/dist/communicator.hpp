// The communicator data parallelism goes through (DESIGN.md "Across processes"):
// rank, size, all-reduce (sum), reduce-scatter (sum), all-gather, broadcast, barrier. Engines: a trivial
// one for a single process, MPI for CPU ranks (harness/dist/mpi/, linked only into
// the headroom-dp worker so the core library never needs libmpi) and NCCL for GPU
// ranks (nccl_communicator.hpp, loaded at run time). Every collective counts its
// bytes, so a property can say how much a step communicated.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace hr::dist {

enum class CommDType : uint8_t { f32, f64, u8 };
size_t comm_dtype_size(CommDType t);

// Bytes moved by the collectives so far, by nccl-tests' definitions
// (PERFORMANCE.md there): `payload` is the message size of each call (all-reduce
// and broadcast: the buffer; all-gather: the gathered output, N x the input), and
// `bus` is what crosses the busiest link of a ring: all-reduce 2 (N-1)/N x payload,
// all-gather and reduce-scatter (N-1)/N x payload (reduce-scatter's payload is its
// input, N x the output), broadcast 1 x payload. One rank moves nothing over
// a bus, so with N = 1 bus bytes are 0.
struct CommStats {
  uint64_t calls = 0;
  uint64_t payload_bytes = 0;
  double bus_bytes = 0;
};

// The nccl-tests bus factor of a collective at N ranks: busbw = algbw * factor.
double all_reduce_bus_factor(int ranks);
double all_gather_bus_factor(int ranks);
double reduce_scatter_bus_factor(int ranks);

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string engine() const = 0;  // "single" | "mpi" | "nccl"
  // Where buffers must live: false for host memory (single, MPI), true for device
  // memory on this rank's GPU (NCCL).
  virtual bool device_buffers() const = 0;

  // In place: buf (count elements) becomes the sum over ranks. On a GPU (NCCL) every
  // collective runs on a stream of the communicator's own, after the work already
  // queued on the device's stream and before the work queued there after it.
  void all_reduce_sum(void* buf, size_t count, CommDType t);
  // The same, except that on a GPU the device's later work does not wait for it: it
  // runs beside that work (DDP's overlap of the gradient all-reduce with the rest of
  // the backward) until join(). Until then buf is the collective's: nothing may read
  // or write it. Engines that block the host (single, MPI) finish it before returning.
  void all_reduce_sum_deferred(void* buf, size_t count, CommDType t);
  // The device's work queued from now on waits for every deferred collective (the
  // host does not wait). synchronize() joins too.
  virtual void join() {}
  // recv (size() x count elements) receives every rank's send (count elements), in rank order.
  void all_gather(const void* send, void* recv, size_t count, CommDType t);
  // recv (count elements) receives the sum over ranks of the rank()-th block of
  // count elements of send (size() x count elements). send and recv do not overlap.
  void reduce_scatter_sum(const void* send, void* recv, size_t count, CommDType t);
  // bytes of buf on `root` are copied to every rank.
  void broadcast(void* buf, size_t bytes, int root);
  void barrier();
  // Blocks until this rank's collectives have completed (NCCL queues them on a stream).
  virtual void synchronize() {}

  const CommStats& stats() const { return stats_; }
  void reset_stats() { stats_ = CommStats{}; }
  // What this rank's receive buffers were given by the collective library, counted
  // where the library is entered rather than by this class: calls and payload
  // bytes (all-reduce and broadcast: the buffer; all-gather: N x the input;
  // reduce-scatter: the output; no bus bytes). The MPI engine reads MPI's profiling
  // interface (every MPI_Allreduce, MPI_Allgather, MPI_Reduce_scatter_block and
  // MPI_Bcast of the process, whoever makes it); NCCL's counts at
  // each NCCL call; the single engine receives nothing.
  virtual CommStats library_received() const { return {}; }

 protected:
  virtual void do_all_reduce_sum(void* buf, size_t count, CommDType t) = 0;
  virtual void do_all_reduce_sum_deferred(void* buf, size_t count, CommDType t) { do_all_reduce_sum(buf, count, t); }
  virtual void do_all_gather(const void* send, void* recv, size_t count, CommDType t) = 0;
  virtual void do_reduce_scatter_sum(const void* send, void* recv, size_t count, CommDType t) = 0;
  virtual void do_broadcast(void* buf, size_t bytes, int root) = 0;
  virtual void do_barrier() = 0;

 private:
  void count_all_reduce(size_t count, CommDType t);
  CommStats stats_;
};

// One process, no engine: every collective is the identity (all-gather copies).
std::unique_ptr<Communicator> make_single_communicator();

}  // namespace hr::dist
