// The Open MPI backend (CPU buffers, any number of nodes): see docs/collectives.md, "MPI backend".
//
// Wraps duplicates of MPI_COMM_WORLD (mpi_state.h runs the collectives; split() MPI_Comm_splits
// them). Before MPI sees the data of a collective, every rank sends its Fingerprint to every other
// rank (one small non-blocking message round), so ranks that issued different collectives all throw
// the same InvalidArgument and no data moves; a wait that runs out names the ranks whose
// fingerprints did not arrive, or, once they all did, the ranks not heard from while waiting
// (mpi_heartbeat.h). Ranks are named by world rank and host, "rank 2 (cohort-node1)" (gathered over
// the communicator at creation: mpi_members.h). Collectives are non-blocking MPI calls (MPI_I*);
// MPI progresses them only inside this backend's calls (issue, Work::done, Work::wait).
// Ownership: the communicator and its Works share the MPI state; a Work may outlive the
// communicator. Destroying the communicator finishes collectives nobody waited for (bounded by
// options.timeout) and frees its MPI communicators.
// Thread safety: as Communicator (one issuing thread); MPI runs at MPI_THREAD_SERIALIZED.
// All ranks must call makeMpiCommunicator (it is collective) and then the same collectives in order.
#pragma once

#include <memory>

#include "collectives/communicator.h"

namespace cohort::collectives {

// Initialises MPI on first use (MPI_Init_thread; finalised at process exit) and wraps
// MPI_COMM_WORLD. The world must match Open MPI's (options.world from OMPI_COMM_WORLD_*
// variables), else InvalidArgument; TimeoutError when not every rank creates its communicator
// within options.timeout. options.faultInjection (or, when it has none, the environment's
// COHORT_TEST_MPI_MISMATCH) applies to it and to its groups (docs/collectives.md).
std::unique_ptr<Communicator> makeMpiCommunicator(const CommunicatorOptions& options);
// The same over the ranks of the world that pass the same `color` (>= 0), numbered in the order of
// their world ranks: makeMpiCommunicator(options)->split({.color = color}).
// Collective over the whole world: every rank calls it, each with its own color.
std::unique_ptr<Communicator> makeMpiCommunicator(const CommunicatorOptions& options, int color);

}  // namespace cohort::collectives
