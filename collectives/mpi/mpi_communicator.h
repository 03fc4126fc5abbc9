// The Open MPI backend (any number of nodes, CPU): see docs/collectives.md.
#pragma once

#include <memory>

#include "collectives/communicator.h"

namespace cohort::collectives {

// Initialises MPI on first use (MPI_Init_thread; finalised at process exit) and wraps
// MPI_COMM_WORLD. The world must match Open MPI's (options.world from OMPI_COMM_WORLD_* variables).
std::unique_ptr<Communicator> makeMpiCommunicator(const CommunicatorOptions& options);

}  // namespace cohort::collectives
