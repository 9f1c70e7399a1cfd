// MPI's profiling interface (PMPI): the collectives the MPI engine uses, counted as
// the library is entered, then passed on to it. Each counts what it delivers into
// this rank's receive buffer, so a property reads bytes received from outside the
// communicator's own bookkeeping (Communicator::library_received).
#include <mpi.h>

#include <cstdint>

#include "harness/dist/mpi/pmpi_received.hpp"

namespace hr::dist {
namespace {

CommStats g_received;

void count(int elements, MPI_Datatype type, int copies) {
  int size = 0;
  if (PMPI_Type_size(type, &size) != MPI_SUCCESS || elements < 0) return;
  ++g_received.calls;
  g_received.payload_bytes += static_cast<uint64_t>(elements) * static_cast<uint64_t>(size) *
                              static_cast<uint64_t>(copies);
}

}  // namespace

CommStats pmpi_received() { return g_received; }

}  // namespace hr::dist

extern "C" {

int MPI_Allreduce(const void* send, void* recv, int count, MPI_Datatype type, MPI_Op op, MPI_Comm comm) {
  hr::dist::count(count, type, 1);
  return PMPI_Allreduce(send, recv, count, type, op, comm);
}

int MPI_Allgather(const void* send, int send_count, MPI_Datatype send_type, void* recv, int recv_count,
                  MPI_Datatype recv_type, MPI_Comm comm) {
  int ranks = 0;
  PMPI_Comm_size(comm, &ranks);
  hr::dist::count(recv_count, recv_type, ranks);
  return PMPI_Allgather(send, send_count, send_type, recv, recv_count, recv_type, comm);
}

int MPI_Reduce_scatter_block(const void* send, void* recv, int recv_count, MPI_Datatype type, MPI_Op op,
                             MPI_Comm comm) {
  hr::dist::count(recv_count, type, 1);
  return PMPI_Reduce_scatter_block(send, recv, recv_count, type, op, comm);
}

int MPI_Bcast(void* buf, int count, MPI_Datatype type, int root, MPI_Comm comm) {
  hr::dist::count(count, type, 1);
  return PMPI_Bcast(buf, count, type, root, comm);
}

}  // extern "C"
