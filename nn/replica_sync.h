// ReplicaSync: the JobSync of synchronous data-parallel training (--mode allreduce). Every rank keeps
// a full replica; GradSync averages gradients every step; barriers and job figures go through the
// communicator. All ranks call every method in the same order (they are collectives). On the CPU the
// gradients move into a Communicator::allocateBuffer buffer, so the shm backend all-reduces the
// buckets where they lie, without staging copies.
// Ownership: borrows the communicator and the model, which must outlive it.
#pragma once

#include "collectives/communicator.h"
#include "nn/grad_sync.h"
#include "nn/job_sync.h"

namespace cohort::nn {

class ReplicaSync final : public JobSync {
 public:
  ReplicaSync(collectives::Communicator& comm, ParamBuffer& params, const GradSyncOptions& options);

  // Every replica starts from rank 0's parameters.
  void broadcastParams() { gradSync_.broadcastParams(); }

  void barrier(const std::string& what) override;
  void reportProgress(int64_t samples, double trainSeconds, int64_t optimizerSteps) override;
  JobProgress jobProgress() const override { return progress_; }
  std::vector<int64_t> optimizerSteps() const override { return {steps_}; }
  void shareOptimizerState(const Optimizer&) override {}
  std::vector<NamedTensor> gatheredOptimizerState(const Optimizer&) const override { return {}; }
  bool replicated() const override { return true; }
  GradReadyListener* gradReady() override { return &gradSync_; }
  void synchronizeGradients() override { gradSync_.finish(); }
  bool anyRankStopping(bool thisRank) override;
  double averageOverRanks(double value) override;

 private:
  collectives::Communicator& comm_;
  collectives::BufferPtr grads_;  // the gradients, on the CPU
  GradSync gradSync_;
  std::chrono::milliseconds timeout_;
  JobProgress progress_;
  int64_t steps_ = 0;
};

}  // namespace cohort::nn
