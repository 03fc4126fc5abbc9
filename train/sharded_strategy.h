// ShardedStrategy: synchronous data-parallel training on one node over ONE shared copy of the
// parameters (mode allreduce over shm when every rank is on this node; docs/nn.md).
//
// The arithmetic is that of all-reduce training (every step applies the average of all ranks'
// gradients, the same on every rank), but nothing is replicated: the parameters, every rank's
// gradients and the optimizer state live in one segment (ipc::SharedParams: values, per-rank
// areas, shared extra area). A step is
//   1. forward and backward on the shared parameters, gradients into this rank's area;
//   2. barrier "gradients";
//   3. this rank's shard of the flat buffer (collectives::ShardReduce): for each block of 1024
//      elements, average the block over all ranks' gradients, then apply the optimizer to that block
//      of the parameters and of the (shared) optimizer state while it is in cache;
//   4. barrier "parameters": nobody reads a parameter or rewrites a gradient before every shard is done.
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

  void step(float gradScale) override;
  uint64_t gradientReductions() const override { return reductions_; }
  SavedState saveState() override { return singleOptimizerState(optimizer_); }
  void loadState(const CheckpointReader& reader) override;

  int64_t shardBegin() const { return reduce_->begin(); }
  int64_t shardEnd() const { return reduce_->end(); }

 private:
  std::unique_ptr<ipc::SharedParams> shared_;
  std::unique_ptr<collectives::ShardReduce> reduce_;
  uint64_t reductions_ = 0;
  nn::Optimizer::BlockHook averageBlock_;
};

}  // namespace cohort::train
