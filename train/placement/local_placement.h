// LocalPlacement: the placement of mode local — one process trains alone, on the CPU or one GPU:
// initialises the parameters, moves them to the GPU if there is one, and steps the optimizer on its
// own whole gradient (train/placement/placement.h); its collectives are LocalCollectives.
// Ownership: borrows the parameters and the optimizer. Thread safety: as Placement.
#pragma once

#include "train/placement/placement.h"

namespace cohort::train {

class LocalPlacement final : public WholeGradientPlacement {
 public:
  explicit LocalPlacement(const PlacementContext& context);

  std::unique_ptr<JobCollectives> makeCollectives() override { return std::make_unique<LocalCollectives>(); }
  SavedState saveState() override { return singleOptimizerState(whole_.optimizer); }
  void loadState(const CheckpointReader& reader) override;

  void reduceGradients(const StepPlan&, LossVote&) override {}  // one rank: its gradient is the job's
  int gradientRank() const override { return 0; }
};

}  // namespace cohort::train
