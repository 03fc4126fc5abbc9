// ShardedStrategy: synchronous data-parallel training over ONE shared copy of the parameters per
// node (mode allreduce over shm on one node, over hierarchical across nodes; docs/nn.md).
//
// The arithmetic is that of all-reduce training (every step applies the average of all ranks'
// gradients, the same on every rank), but nothing is replicated inside a node: the parameters,
// every rank's gradients and the optimizer state live in one segment (ipc::SharedParams: values,
// per-rank areas, shared extra area). A step is
//   1. forward and backward on the shared parameters, gradients into this rank's area;
//   2. barrier "gradients";
//   3. this rank's shard of the flat buffer (collectives::ShardReduce): average each block of 1024
//      elements over the node's ranks' gradients; across nodes, the shard is then averaged with the
//      same local rank's shard on every other node over MPI (all of a node's links busy at once);
//      then the sum of the squares of the shard's averages;
//   4. an all-gather of the shards' sums of squares (and the ranks' loss flags) in the job segment:
//      every rank has the gradient's global norm, the same bits, and the same verdict (train/step.h);
//      across nodes the loss flags travel in a small MPI all-reduce over the world, issued before
//      the averaging so that its latency hides there; a non-finite step ends here on every rank,
//      nothing updated;
//   5. apply the optimizer to the shard's parameters and (shared) optimizer state, block by block,
//      scaling each gradient block by the clip coefficient first when clipping;
//   6. barrier "parameters": nobody reads a parameter or rewrites a gradient before every shard is done.
// Each element is updated by one rank of a node only, so there are no races and results are
// deterministic; across nodes every node applies the same averaged gradient to the same state, so
// the nodes' copies stay equal (replicas of the node's copy, as replicas of a worker's elsewhere).
// Local rank 0 initialises the parameters (across nodes, world rank 0's node's copy is then
// broadcast to the others); the optimizer state being one shared buffer per node, rank 0's
// checkpoint holds all of it, and each node's local rank 0 alone loads parameters and state on resume.
// Ownership: owns its segments (and across nodes its MPI communicators). Thread safety: as Strategy.
#pragma once

#include <memory>

#include "collectives/hierarchical/hierarchical_communicator.h"
#include "collectives/shard_reduce.h"
#include "ipc/shared_params.h"
#include "train/segment_strategy.h"

namespace cohort::train {

class ShardedStrategy final : public SegmentStrategy {
 public:
  // Every rank of the job constructs one, with the same model and optimizer. The optimizer must be
  // on the CPU; its state moves into the segment. A job across nodes passes the world's groups
  // (collectives::makeNodeGroups, with its cross-node communicators: every node the same size).
  explicit ShardedStrategy(const StrategyContext& context, collectives::NodeGroups groups = {});

  StepResult step(const StepPlan& plan) override;
  // Across nodes: the node's barrier (naming a missing local worker), then the world's.
  void barrier(const std::string& what) override;
  void reduce(std::span<double> values, ScalarOp op) override;
  uint64_t gradientReductions() const override { return reductions_; }
  SavedState saveState() override { return singleOptimizerState(optimizer_); }
  void loadState(const CheckpointReader& reader) override;

  int64_t shardBegin() const { return reduce_->begin(); }
  int64_t shardEnd() const { return reduce_->end(); }

 private:
  bool acrossNodes() const { return cross_ != nullptr; }

  std::unique_ptr<ipc::SharedParams> shared_;
  std::unique_ptr<collectives::Communicator> world_;  // across nodes only: every rank, over MPI
  std::unique_ptr<collectives::Communicator> cross_;  // across nodes only: this local rank of every node
  int rank_;
  int worldSize_;
  float lossFlag_ = 0;  // across nodes: (world size - rank) when this rank's loss is non-finite
  std::unique_ptr<collectives::ShardReduce> reduce_;
  uint64_t reductions_ = 0;
  float clip_ = 1.0f;  // this step's clip coefficient
  nn::Optimizer::BlockHook clipBlock_;
};

}  // namespace cohort::train
