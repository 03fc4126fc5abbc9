// The conformance checks of Communicator::split (communicator.h), for conformance_worker: run on
// every rank of a communicator over the whole job, on CPU buffers (shm, mpi, hierarchical).
// They assume nodes of consecutive ranks (cohortrun, mpirun on one host, --simulate-nodes).
#pragma once

#include <chrono>

#include "collectives/communicator.h"
#include "runtime/world_info.h"

namespace cohort::collectives::testing {

// The node group and the same-local-rank group (their sizes, ranks and sums, in fp32 and bf16, one
// message large enough for every backend's pipelined path), groups that run different collectives
// at once, a collective on the parent interleaved with the groups', key order, kNoGroup, and a bad
// color (InvalidArgument on every rank, the parent still usable). Prints one line per failure and
// returns their number.
int checkSplit(Communicator& parent, const runtime::WorldInfo& world, std::chrono::milliseconds timeout);

}  // namespace cohort::collectives::testing
