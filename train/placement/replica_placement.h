// ReplicaPlacement: the placement of synchronous data parallel with a full replica per rank (mode
// allreduce over mpi, over nccl on GPUs, or over shm or hierarchical with replicas): every rank
// initialises its replica, rank 0's parameters are broadcast, and GradSync averages the gradients
// every step in buckets whose all-reduce starts while backward is still running (train/placement/grad_sync.h).
// Its step stage reduceGradients waits for the buckets, with the loss vote queued behind them on
// the same communicator so that its latency hides in theirs; every replica then holds the same
// averaged gradient (the all-reduce's result is bitwise the same on every rank), so the rest of the
// step is the whole-gradient placement's and every rank reaches the same verdict. Its collectives
// (CommCollectives) go through the same communicator. On the CPU the gradients live in a
// Communicator::allocateBuffer buffer, so the shm backend all-reduces the buckets where they lie.
// Every rank holds the whole state, so rank 0's checkpoint is the job's and every rank loads all of it.
// Ownership: owns the communicator; borrows the parameters and the optimizer.
// Thread safety: as Placement; every stage is collective (same order on every rank).
#pragma once

#include <memory>

#include "collectives/communicator.h"
#include "train/placement/grad_sync.h"
#include "train/placement/placement.h"

namespace cohort::train {

class ReplicaPlacement final : public WholeGradientPlacement {
 public:
  // `backend`: shm, mpi, hierarchical or nccl, or empty for the world's default with flat mpi where
  // the nodes are uneven (collectives::makeCommunicator). Throws as makeCommunicator.
  ReplicaPlacement(const PlacementContext& context, const std::string& backend);

  std::unique_ptr<JobCollectives> makeCollectives() override;
  nn::UnitListener* unitListener() override { return gradSync_.get(); }
  uint64_t gradientReductions() const override { return gradSync_->allReducesIssued(); }
  SavedState saveState() override { return singleOptimizerState(whole_.optimizer); }
  void loadState(const CheckpointReader& reader) override;

  void reduceGradients(const StepPlan& plan, LossVote& vote) override;
  int gradientRank() const override { return -1; }  // the ranks' average

  const collectives::Communicator& communicator() const { return *comm_; }

 private:
  std::chrono::milliseconds timeout_;
  Timeline& timeline_;
  std::unique_ptr<collectives::Communicator> comm_;
  collectives::BufferPtr grads_;  // the gradients, on the CPU
  std::unique_ptr<GradSync> gradSync_;
};

}  // namespace cohort::train
