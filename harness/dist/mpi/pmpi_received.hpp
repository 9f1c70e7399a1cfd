// What MPI's collectives delivered to this rank's receive buffers, counted through
// MPI's profiling interface (pmpi_received.cpp): calls and payload bytes.
#pragma once

#include "harness/dist/communicator.hpp"

namespace hr::dist {

CommStats pmpi_received();

}  // namespace hr::dist
