// makePlacement: the one factory of placements (train/placement/placement.h) and their collectives
// (train/placement/job_collectives.h), from the job's resolved choice (train/placement/placement_choice.h). Job::place
// calls it once, after the ranks agreed on the choice; it decides nothing the choice has not said,
// except what the choice leaves to the world's node sizes (UnevenNodes: see placement_choice.h).
// Collective: every rank of the job calls it with the same choice (communicators, segments).
// Throws as the placements' constructors (InvalidArgument, TimeoutError naming missing ranks).
// Thread safety: the training thread only.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "runtime/dtype.h"
#include "train/placement/job_collectives.h"
#include "train/placement/placement.h"
#include "train/placement/placement_choice.h"

namespace cohort::train {

struct Placed {
  std::unique_ptr<Placement> placement;
  // Borrows the placement's transports: destroy it first (Placed's destructor does).
  std::unique_ptr<JobCollectives> collectives;
  // Where the gradients are averaged, as the communicator reports it: the choice's backendName(),
  // or "mpi" where the choice's UnevenNodes::kFlatMpi applied.
  std::string backend;
  // Whether every rank keeps a replica (the choice's, or flat mpi replicas where it applied).
  bool replicas = false;

  Placed() = default;
  Placed(Placed&&) = default;
  Placed& operator=(Placed&&) = default;
  ~Placed() { collectives.reset(); }
};

struct PlacementOptions {
  bool zeroPrefetch = true;  // JobOptions::zeroPrefetch
  int64_t averageEvery = 1;  // Hogwild across nodes: the averaging period (>= 1)
  runtime::DType precision = runtime::DType::kF32;  // JobOptions::precision (ZeRO's bf16 gathers)
};

Placed makePlacement(const ResolvedPlacement& choice, const PlacementContext& context, const PlacementOptions& options);

}  // namespace cohort::train
