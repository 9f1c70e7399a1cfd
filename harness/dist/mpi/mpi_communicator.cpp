// MPI engine of the communicator (see mpi_communicator.hpp): MPI_Allreduce,
// MPI_Allgather, MPI_Reduce_scatter_block, MPI_Bcast and MPI_Barrier over
// MPI_COMM_WORLD.
#include "harness/dist/mpi/mpi_communicator.hpp"

#include <mpi.h>

#include "harness/check.hpp"
#include "harness/dist/mpi/pmpi_received.hpp"

namespace hr::dist {
namespace {

MPI_Datatype mpi_type(CommDType t) {
  switch (t) {
    case CommDType::f32: return MPI_FLOAT;
    case CommDType::f64: return MPI_DOUBLE;
    case CommDType::u8: return MPI_BYTE;
  }
  return MPI_BYTE;
}

void mpi_ok(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  HR_CHECK(false, "{}: {}", what, std::string(msg, static_cast<size_t>(len)));
}

// Counts above INT_MAX would need MPI 4's large-count calls; the properties and
// the benchmark stay far below (a 2^31-element message is 8 GiB of fp32).
int mpi_count(size_t count) {
  HR_ARG_CHECK(count <= static_cast<size_t>(INT32_MAX), "MPI collective of {} elements: over INT_MAX", count);
  return static_cast<int>(count);
}

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator() {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string engine() const override { return "mpi"; }
  bool device_buffers() const override { return false; }
  CommStats library_received() const override { return pmpi_received(); }

 protected:
  void do_all_reduce_sum(void* buf, size_t count, CommDType t) override {
    mpi_ok(MPI_Allreduce(MPI_IN_PLACE, buf, mpi_count(count), mpi_type(t), MPI_SUM, MPI_COMM_WORLD), "MPI_Allreduce");
  }
  void do_all_gather(const void* send, void* recv, size_t count, CommDType t) override {
    mpi_ok(MPI_Allgather(send, mpi_count(count), mpi_type(t), recv, mpi_count(count), mpi_type(t), MPI_COMM_WORLD),
           "MPI_Allgather");
  }
  void do_reduce_scatter_sum(const void* send, void* recv, size_t count, CommDType t) override {
    mpi_ok(MPI_Reduce_scatter_block(send, recv, mpi_count(count), mpi_type(t), MPI_SUM, MPI_COMM_WORLD),
           "MPI_Reduce_scatter_block");
  }
  void do_broadcast(void* buf, size_t bytes, int root) override {
    mpi_ok(MPI_Bcast(buf, mpi_count(bytes), MPI_BYTE, root, MPI_COMM_WORLD), "MPI_Bcast");
  }
  void do_barrier() override { mpi_ok(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier"); }

 private:
  int rank_ = 0, size_ = 1;
};

}  // namespace

MpiSession::MpiSession(int* argc, char*** argv) {
  MPI_Init(argc, argv);
  // Errors come back as codes (mpi_ok turns them into exceptions) instead of
  // aborting the job from inside the library.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  comm_ = std::make_unique<MpiCommunicator>();
  MPI_Comm node = MPI_COMM_NULL;
  if (MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node) == MPI_SUCCESS &&
      node != MPI_COMM_NULL) {
    MPI_Comm_rank(node, &local_rank_);
    MPI_Comm_free(&node);
  }
}

MpiSession::~MpiSession() {
  comm_.reset();
  MPI_Finalize();
}

void MpiSession::abort(int code) {
  MPI_Abort(MPI_COMM_WORLD, code);
  std::abort();
}

}  // namespace hr::dist
