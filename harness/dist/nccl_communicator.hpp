// The NCCL engine of the communicator, for GPU ranks. NCCL is loaded at run time
// (dlopen of libnccl.so.2) rather than linked: the library is ~200 MB, a bare GPU
// machine may lack it and the GPU bundle cannot carry it, so no binary needs it to
// start, and a missing NCCL is a stated skip. Built with the CUDA backend and
// NCCL's header; otherwise every entry point says why it is unavailable.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "harness/dist/communicator.hpp"

namespace hr {
class Device;
}

namespace hr::dist {

// Empty when NCCL can be used here (built with it, libnccl.so.2 loads, a GPU
// answers); otherwise the reason, for a skip.
std::string nccl_unavailable_reason();

// A new ncclUniqueId (on rank 0), as bytes to broadcast to the other ranks (over
// MPI, as nccl-tests does; one rank needs no broadcast).
std::vector<uint8_t> nccl_unique_id();

// This rank's NCCL communicator over `ranks` ranks on CUDA device `dev`, its
// collectives queued on the device's stream and its waits counted as the device's
// host waits. Throws Error with NCCL's message on failure; after a failed call it
// is aborted (ncclCommAbort), not destroyed, when it goes.
std::unique_ptr<Communicator> make_nccl_communicator(const std::vector<uint8_t>& unique_id, int rank, int ranks,
                                                     Device& dev);

}  // namespace hr::dist
