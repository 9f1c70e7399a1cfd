// The MPI engine of the communicator, for CPU ranks launched with mpirun, and the
// NCCL bootstrap over it (rank 0's ncclUniqueId broadcast to every rank, as
// nccl-tests does). Linked only into the headroom-dp worker, so headroom_core and
// everything ci/gpu-bundle carries never need libmpi.
#pragma once

#include <memory>

#include "harness/dist/communicator.hpp"

namespace hr::dist {

// Initialises MPI (MPI_Init) on construction and finalises it on destruction;
// one per process. Collectives run over MPI_COMM_WORLD on host buffers.
class MpiSession {
 public:
  MpiSession(int* argc, char*** argv);
  ~MpiSession();
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;
  Communicator& comm() { return *comm_; }
  // This rank's index among the ranks on its node (MPI_Comm_split_type over shared
  // memory), whatever started the job: mpirun, Slurm's srun, another launcher.
  int local_rank() const { return local_rank_; }
  // Ends every rank of the job (a rank that failed must not leave the others
  // waiting in a collective).
  [[noreturn]] void abort(int code);

 private:
  std::unique_ptr<Communicator> comm_;
  int local_rank_ = 0;
};

}  // namespace hr::dist
