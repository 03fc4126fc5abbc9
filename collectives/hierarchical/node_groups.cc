// NodeGroups and makeNodeGroups (declared in hierarchical_communicator.h): who is on which node,
// and the world's communicators the hierarchical backend and the shared-copy placement across nodes
// are built from.
#include <vector>

#include "collectives/hierarchical/hierarchical_communicator.h"
#include "collectives/mpi/mpi_communicator.h"
#include "collectives/split.h"
#include "runtime/error.h"

namespace cohort::collectives {

int NodeGroups::crossRank(int w) const {
  int position = 0;
  for (int r = 0; r < w; ++r) position += localRank[r] == localRank[w];
  return position;
}

NodeGroups makeNodeGroups(const CommunicatorOptions& options, bool flatWhenUneven) {
  NodeGroups groups;
  groups.world = makeMpiCommunicator(options);
  const Communicator& world = *groups.world;
  // Every rank's workers per node and local rank (small integers: exact in floats).
  const float mine[2] = {static_cast<float>(options.world.localWorldSize), static_cast<float>(options.world.localRank)};
  std::vector<float> all(2 * static_cast<size_t>(world.size()));
  groups.world->allGather(mine, all.data(), 2, {})->wait(options.timeout);
  groups.localSize = options.world.localWorldSize;
  for (int r = 0; r < world.size(); ++r) {
    groups.localRank.push_back(static_cast<int>(all[2 * r + 1]));
    const int theirs = static_cast<int>(all[2 * r]);
    if (theirs == groups.localSize) continue;
    if (flatWhenUneven) return groups;
    COHORT_THROW(InvalidArgument)
        << "the hierarchical backend needs the same number of workers on every node, but rank " << world.rank()
        << "'s node runs " << groups.localSize << " and rank " << r << "'s node runs " << theirs
        << ": use --backend mpi";
  }
  groups.nodes = world.size() / groups.localSize;
  groups.cross = splitSameLocalRank(*groups.world, options.world);
  return groups;
}

}  // namespace cohort::collectives
