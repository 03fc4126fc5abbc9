// ReplicaStrategy: synchronous data parallel with a full replica per rank (mode allreduce over mpi,
// over nccl on GPUs, or over shm with replicas): every rank initialises its replica, rank 0's
// parameters are broadcast, and GradSync averages the gradients every step in buckets whose
// all-reduce starts while backward is still running (train/grad_sync.h). Barriers and scalar
// reductions go through the communicator. On the CPU the gradients live in a
// Communicator::allocateBuffer buffer, so the shm backend all-reduces the buckets where they lie.
// Every rank holds the whole state, so rank 0's checkpoint is the job's and every rank loads all of it.
// Ownership: owns the communicator; borrows the parameters and the optimizer.
// Thread safety: as Strategy; every method is collective (same order on every rank).
#pragma once

#include <memory>

#include "collectives/communicator.h"
#include "train/grad_sync.h"
#include "train/strategy.h"

namespace cohort::train {

class ReplicaStrategy final : public Strategy {
 public:
  // `backend`: shm, mpi, hierarchical or nccl, or empty for the world's default (collectives::
  // resolveBackend). Throws as collectives::makeCommunicator.
  ReplicaStrategy(const StrategyContext& context, const std::string& backend);

  nn::UnitListener* unitListener() override { return gradSync_.get(); }
  StepResult step(const StepPlan& plan) override;
  uint64_t gradientReductions() const override { return gradSync_->allReducesIssued(); }
  void barrier(const std::string& what) override;
  void reduce(std::span<double> values, ScalarOp op) override;
  SavedState saveState() override { return singleOptimizerState(optimizer_); }
  void loadState(const CheckpointReader& reader) override;
  const collectives::Communicator& communicator() const { return *comm_; }

 private:
  nn::ParamBuffer& params_;
  nn::Optimizer& optimizer_;
  runtime::cuda::GpuContext* gpu_;
  std::chrono::milliseconds timeout_;
  Timeline& timeline_;
  std::unique_ptr<collectives::Communicator> comm_;
  collectives::BufferPtr grads_;  // the gradients, on the CPU
  std::unique_ptr<GradSync> gradSync_;
  int rank_, worldSize_;
  float lossFlag_ = 0;  // this step's loss flag, all-reduced in place
};

}  // namespace cohort::train
