// Member: who is behind each rank of an mpi backend communicator (its rank in MPI_COMM_WORLD and
// its host), so that every message that names ranks also names their hosts: a rank of a multi-node
// job that does not arrive is usually a node that is gone or cut off.
//
// Members are named by world rank, the rank the user started and sees in every log line, also on a
// communicator over a subset of the world whose own ranks differ. Value types and free functions;
// gatherMembers is collective over the communicator given.
//
//   std::vector<Member> members = gatherMembers(comm, worldRank, timeout);
//   describeMembers(members, {2, 3});  // "ranks 2 (cohort-node1), 3 (cohort-node1)"
#pragma once

#include <openmpi/mpi.h>

#include <chrono>
#include <string>
#include <vector>

namespace cohort::collectives::mpi_detail {

struct Member {
  int worldRank = -1;
  std::string host;
};

// Every member's world rank and host name, indexed by rank in `comm`: one MPI_Iallgather of fixed
// records over `comm`, polled and bounded by `timeout` (TimeoutError, and MPI is then not finalised
// at exit). Every member of `comm` must call it, each with its own world rank. Also tells the
// MpiEnvironment the timeout and, for a communicator over the whole world, the members (the end of
// the job names the ranks that did not finish).
std::vector<Member> gatherMembers(MPI_Comm comm, int worldRank, std::chrono::milliseconds timeout);

// "rank 2 (cohort-node1)", or "ranks 2 (cohort-node1), 3 (cohort-node1)", for ranks in the
// communicator whose members these are.
std::string describeMembers(const std::vector<Member>& members, const std::vector<int>& commRanks);

}  // namespace cohort::collectives::mpi_detail
