#include "train/placement/placement_factory.h"

#include "collectives/hierarchical/hierarchical_communicator.h"
#include "runtime/error.h"
#include "train/placement/hogwild_placement.h"
#include "train/placement/local_placement.h"
#include "train/placement/replica_placement.h"
#include "train/placement/shared_copy_placement.h"
#include "train/placement/sharded_placement.h"

namespace cohort::train {

namespace {

// Replicas over the chosen backend; with UnevenNodes::kFlatMpi the communicator gets the world's
// default instead (hierarchical, flat mpi where the nodes are uneven: collectives::makeCommunicator).
std::unique_ptr<ReplicaPlacement> makeReplicas(const ResolvedPlacement& choice, const PlacementContext& context) {
  const bool flatWhenUneven = choice.unevenNodes == UnevenNodes::kFlatMpi;
  return std::make_unique<ReplicaPlacement>(context, flatWhenUneven ? std::string() : choice.backendName());
}

// One copy per node: on one node over shm; across nodes over hierarchical, whose node groups tell the
// nodes' sizes: uneven, the choice's rule applies (flat mpi replicas, or makeNodeGroups refuses).
std::unique_ptr<Placement> makeSharedCopy(const ResolvedPlacement& choice, const PlacementContext& context) {
  if (!context.world.spansNodes()) return std::make_unique<SharedCopyPlacement>(context);
  COHORT_CHECK(choice.backend == Backend::kHierarchical) << "a shared copy across nodes over " << choice.backendName();
  collectives::NodeGroups groups =
      collectives::makeNodeGroups({.backend = "hierarchical",
                                   .world = context.world,
                                   .timeout = context.timeout,
                                   .faultInjection = faultInjectionOf(context.testHooks)},
                                  choice.unevenNodes == UnevenNodes::kFlatMpi);
  if (groups.cross) return std::make_unique<SharedCopyPlacement>(context, std::move(groups));
  return std::make_unique<ReplicaPlacement>(context, "mpi");
}

}  // namespace

Placed makePlacement(const ResolvedPlacement& choice, const PlacementContext& context,
                     const PlacementOptions& options) {
  Placed placed;
  placed.backend = choice.backendName();
  switch (choice.kind) {
    case PlacementKind::kLocal:
      placed.placement = std::make_unique<LocalPlacement>(context);
      break;
    case PlacementKind::kHogwild:
      placed.placement =
          std::make_unique<HogwildPlacement>(context, HogwildOptions{.averageEvery = options.averageEvery});
      break;
    case PlacementKind::kReplicas:
      placed.placement = makeReplicas(choice, context);
      break;
    case PlacementKind::kSharedCopy:
      placed.placement = makeSharedCopy(choice, context);
      break;
    case PlacementKind::kSharded:
      placed.placement = std::make_unique<ShardedPlacement>(
          context, ShardedOptions{.stage = choice.zero,
                                  .scope = choice.zeroScope,
                                  .prefetch = options.zeroPrefetch,
                                  .precision = options.precision,
                                  .backend = choice.unevenNodes == UnevenNodes::kFlatMpi ? "" : choice.backendName()});
      break;
  }
  // The backend the communicator got (flat mpi where the nodes turned out uneven).
  if (const auto* replicas = dynamic_cast<const ReplicaPlacement*>(placed.placement.get())) {
    placed.backend = replicas->communicator().backend();
    placed.replicas = true;
  }
  if (const auto* sharded = dynamic_cast<const ShardedPlacement*>(placed.placement.get())) {
    placed.backend = sharded->communicator().backend();
    placed.replicas = true;  // each rank holds the whole parameters (stages 1 and 2)
  }
  placed.collectives = placed.placement->makeCollectives();
  return placed;
}

}  // namespace cohort::train
