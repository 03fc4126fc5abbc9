// The hierarchical backend (CPU, ranks on several nodes): shared memory inside each node, MPI
// between nodes. See docs/collectives.md, "Hierarchical backend".
//
// An all-reduce of n floats over N nodes of L workers each runs in three stages:
//  1. inside the node, a reduce-scatter over shared memory (the shm backend): local rank k ends up
//     with the node's sum of chunk k (ceil(n/L) floats; the last chunk is padded with zeros);
//  2. across nodes, local rank k all-reduces its chunk with local rank k of every other node over
//     MPI (one MPI communicator per local rank): the L transfers of a node run at once, each 1/L of
//     the data, so every link carries the node's sum once instead of every worker's gradient;
//  3. inside the node, an all-gather over shared memory gives every worker the whole result.
// avg divides the sum by the world size at the end: float(sum) * float(1/W), as in every backend.
// All-reduces, reduce-scatters and all-gathers of up to 256 KiB (the full buffer as fp32), whose
// time is latency, run as one MPI collective over the world. Larger reduce-scatters and all-gathers
// run in two levels too (node, then across nodes, or the reverse), their chunks permuted from
// world-rank order; a larger reduction first compares every rank's whole fingerprint over the
// world, since its stages move fp32 and cannot see a rank that issued bf16 where others issued fp32.
// Barrier and broadcast take the same path (node, then same local rank across nodes, then node).
// split(): a group inside one node is split from the node's shm communicator (backend "shm"), any
// other from the world's MPI one ("mpi").
//
// Collectives run one after another in issue order on the communicator's own thread, which is the
// only thread that touches the node's shm communicator and the MPI ones; callers issue and return
// (GradSync overlaps backward this way). Every stage checks its own fingerprints: a rank that
// issued something else is named by the stage where the ranks meet (inside its node, or across
// nodes with its local rank's partners); a wait that runs out names the ranks that did not arrive.
// After an error the communicator is unusable (every later wait() rethrows it).
//
// Every node must run the same number of workers (local rank k needs a partner on every node).
// Thread safety: as Communicator (issue and wait from one thread).
#pragma once

#include <memory>
#include <vector>

#include "collectives/communicator.h"

namespace cohort::collectives {

// Collective over the whole world (mpirun's). When the nodes run different numbers of workers:
// with `flatWhenUneven`, the flat MPI communicator instead (backend() says "mpi"); otherwise
// InvalidArgument naming two nodes' worker counts, on every rank.
std::unique_ptr<Communicator> makeHierarchicalCommunicator(const CommunicatorOptions& options, bool flatWhenUneven);

// The world split by node, for work that is shared inside each node and replicated across nodes
// (this backend; the shared-copy placement across nodes, train/placement/shared_copy_placement.h).
struct NodeGroups {
  std::unique_ptr<Communicator> world;  // every rank, over MPI
  // This local rank of every node, over MPI, numbered by node (world-rank order); null when the
  // nodes run different numbers of workers (and the caller allowed that).
  std::unique_ptr<Communicator> cross;
  std::vector<int> localRank;  // by world rank
  int localSize = 1;           // workers per node
  int nodes = 1;
  // The position of world rank `w` in its local rank's cross-node communicator.
  int crossRank(int w) const;
};

// Collective over the whole world: every rank's local rank and node size from one all-gather over
// MPI, then the cross-node communicators (the world's split by local rank: splitSameLocalRank).
// Nodes with different numbers of workers: `cross` stays null with `flatWhenUneven`, else
// InvalidArgument naming two of them, on every rank.
NodeGroups makeNodeGroups(const CommunicatorOptions& options, bool flatWhenUneven);

}  // namespace cohort::collectives
