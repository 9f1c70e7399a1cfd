// The communicator's byte counting and the single-process engine (see
// communicator.hpp); the MPI and NCCL engines live in their own files.
#include "harness/dist/communicator.hpp"

#include <cstring>

#include "harness/check.hpp"

namespace hr::dist {

size_t comm_dtype_size(CommDType t) {
  switch (t) {
    case CommDType::f32: return 4;
    case CommDType::f64: return 8;
    case CommDType::u8: return 1;
  }
  return 1;
}

double all_reduce_bus_factor(int ranks) { return ranks > 0 ? 2.0 * (ranks - 1) / ranks : 0.0; }
double all_gather_bus_factor(int ranks) { return ranks > 0 ? static_cast<double>(ranks - 1) / ranks : 0.0; }
double reduce_scatter_bus_factor(int ranks) { return all_gather_bus_factor(ranks); }

void Communicator::all_reduce_sum(void* buf, size_t count, CommDType t) {
  do_all_reduce_sum(buf, count, t);
  count_all_reduce(count, t);
}

void Communicator::all_reduce_sum_deferred(void* buf, size_t count, CommDType t) {
  do_all_reduce_sum_deferred(buf, count, t);
  count_all_reduce(count, t);
}

void Communicator::count_all_reduce(size_t count, CommDType t) {
  const uint64_t bytes = count * comm_dtype_size(t);
  ++stats_.calls;
  stats_.payload_bytes += bytes;
  stats_.bus_bytes += static_cast<double>(bytes) * all_reduce_bus_factor(size());
}

void Communicator::all_gather(const void* send, void* recv, size_t count, CommDType t) {
  do_all_gather(send, recv, count, t);
  const uint64_t bytes = count * comm_dtype_size(t) * static_cast<uint64_t>(size());
  ++stats_.calls;
  stats_.payload_bytes += bytes;
  stats_.bus_bytes += static_cast<double>(bytes) * all_gather_bus_factor(size());
}

void Communicator::reduce_scatter_sum(const void* send, void* recv, size_t count, CommDType t) {
  const size_t bytes = count * comm_dtype_size(t);
  const auto* s = static_cast<const char*>(send);
  const auto* r = static_cast<const char*>(recv);
  HR_ARG_CHECK(r + bytes <= s || s + bytes * static_cast<size_t>(size()) <= r,
               "reduce_scatter_sum: the send and receive buffers overlap");
  do_reduce_scatter_sum(send, recv, count, t);
  const uint64_t payload = bytes * static_cast<uint64_t>(size());
  ++stats_.calls;
  stats_.payload_bytes += payload;
  stats_.bus_bytes += static_cast<double>(payload) * reduce_scatter_bus_factor(size());
}

void Communicator::broadcast(void* buf, size_t bytes, int root) {
  HR_ARG_CHECK(root >= 0 && root < size(), "broadcast: root {} is not a rank of {}", root, size());
  do_broadcast(buf, bytes, root);
  ++stats_.calls;
  stats_.payload_bytes += bytes;
  stats_.bus_bytes += size() > 1 ? static_cast<double>(bytes) : 0.0;
}

void Communicator::barrier() { do_barrier(); }

namespace {

class SingleCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string engine() const override { return "single"; }
  bool device_buffers() const override { return false; }

 protected:
  void do_all_reduce_sum(void*, size_t, CommDType) override {}
  void do_all_gather(const void* send, void* recv, size_t count, CommDType t) override {
    if (send != recv) std::memmove(recv, send, count * comm_dtype_size(t));
  }
  void do_reduce_scatter_sum(const void* send, void* recv, size_t count, CommDType t) override {
    std::memcpy(recv, send, count * comm_dtype_size(t));
  }
  void do_broadcast(void*, size_t, int) override {}
  void do_barrier() override {}
};

}  // namespace

std::unique_ptr<Communicator> make_single_communicator() { return std::make_unique<SingleCommunicator>(); }

}  // namespace hr::dist
