// ShardedStrategy: synchronous data-parallel training on one node over ONE shared copy of the
// parameters (mode allreduce over shm when every rank is on this node; docs/nn.md).
//
// The arithmetic is that of all-reduce training (every step applies the average of all ranks'
// gradients, the same on every rank), but nothing is replicated: the parameters, every rank's
// gradients and the optimizer state live in one segment (ipc::SharedParams: values, per-rank
// areas, shared extra area). A step is
//   1. forward and backward on the shared parameters, gradients into this rank's area;
//   2. barrier "gradients";
//   3. this rank's shard of the flat buffer (collectives::ShardReduce): average each block of 1024
//      elements over all ranks' gradients, adding up the squares of the averages;
//   4. an all-gather of the shards' sums of squares (and the ranks' loss flags) in the job segment:
//      every rank has the gradient's global norm, the same bits, and the same verdict (train/step.h);
//      a non-finite step ends here on every rank, nothing updated;
//   5. apply the optimizer to the shard's parameters and (shared) optimizer state, block by block,
//      scaling each gradient block by the clip coefficient first when clipping;
//   6. barrier "parameters": nobody reads a parameter or rewrites a gradient before every shard is done.
// Each element is updated by one rank only, so there are no races and results are deterministic.
// Local rank 0 initialises the parameters; the optimizer state being one shared buffer, rank 0's
// checkpoint holds all of it, and local rank 0 alone loads parameters and state on resume.
// Ownership: owns its segments. Thread safety: as Strategy.
#pragma once

#include <memory>

#include "collectives/shard_reduce.h"
#include "ipc/shared_params.h"
#include "train/segment_strategy.h"

namespace cohort::train {

class ShardedStrategy final : public SegmentStrategy {
 public:
  // Every rank of the job constructs one, with the same model and optimizer. The optimizer must be
  // on the CPU; its state moves into the segment.
  explicit ShardedStrategy(const StrategyContext& context);

  StepResult step(const StepPlan& plan) override;
  uint64_t gradientReductions() const override { return reductions_; }
  SavedState saveState() override { return singleOptimizerState(optimizer_); }
  void loadState(const CheckpointReader& reader) override;

  int64_t shardBegin() const { return reduce_->begin(); }
  int64_t shardEnd() const { return reduce_->end(); }

 private:
  std::unique_ptr<ipc::SharedParams> shared_;
  std::unique_ptr<collectives::ShardReduce> reduce_;
  uint64_t reductions_ = 0;
  float clip_ = 1.0f;  // this step's clip coefficient
  nn::Optimizer::BlockHook clipBlock_;
};

}  // namespace cohort::train
