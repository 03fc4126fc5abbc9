// Who is in which group of a Communicator::split (communicator.h): MPI_Comm_split's rule, worked
// out by every rank alike from one all-gather of every rank's color and key over the parent. The
// backends that build their groups themselves (shm, mpi, hierarchical) start from it.
// planSplit is collective over `parent` (it issues one all-gather, in order with the parent's other
// collectives); the rest are pure functions.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "collectives/communicator.h"
#include "runtime/world_info.h"

namespace cohort::collectives {

struct SplitPlan {
  std::vector<int> colors;             // every parent rank's color (SplitOptions::kNoGroup for none)
  std::vector<int> keys;               // every parent rank's key
  int color = SplitOptions::kNoGroup;  // this rank's
  int rank = -1;                       // this rank's place in its group; -1: in none
  std::vector<int> members;            // this rank's group: parent ranks by group rank
  int size() const { return static_cast<int>(members.size()); }
};

// Gathers every rank's options over `parent` (waiting up to `timeout`) and orders each group by
// (key, parent rank). Throws InvalidArgument, on every rank alike, when a rank passed a color below
// SplitOptions::kNoGroup, naming that rank; and what the parent's all-gather throws.
SplitPlan planSplit(Communicator& parent, const SplitOptions& options, std::chrono::milliseconds timeout);

// The plan from every rank's colors and keys (planSplit's second half; `rank` is this rank's).
SplitPlan planFrom(std::vector<int> colors, std::vector<int> keys, int rank);

// The two groups a job across nodes needs, split from a communicator over the whole job (its rank
// is world.rank): the ranks of this node, numbered by local rank; and this local rank on every node,
// numbered by node. Nodes are numbered as the hierarchical backend numbers them: node j holds the
// j-th rank, in rank order, of each local rank. Collective over `world` like split();
// splitNodeRanks splits twice (the first group, by local rank, only tells this rank its node).
std::unique_ptr<Communicator> splitNodeRanks(Communicator& world, const runtime::WorldInfo& info);
std::unique_ptr<Communicator> splitSameLocalRank(Communicator& world, const runtime::WorldInfo& info);

// A name for the group of `color` made by split number `index` of a communicator: "s<index>c<color>-"
// (a prefix for the group's shared-memory segment names; [A-Za-z0-9-] only).
std::string groupScope(uint64_t index, int color);

}  // namespace cohort::collectives
