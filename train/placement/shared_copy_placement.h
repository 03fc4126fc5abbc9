// SharedCopyPlacement: the placement of synchronous data parallel over ONE shared copy of the
// parameters per node, which the node's ranks update in slices (mode allreduce over shm on one
// node, over hierarchical across nodes; docs/nn.md). Not ZeRO sharding (nn/shard_map.h): every
// node holds the whole model, once.
//
// The arithmetic is that of all-reduce training (every step applies the average of all ranks'
// gradients, the same on every rank), but nothing is replicated inside a node: the parameters,
// every rank's gradients and the optimizer state live in one segment (ipc::SharedParams: values,
// per-rank areas, shared extra area). Its stages of the one step (train/placement/placement.h):
//   beginStep        barrier "gradients" (every rank's backward is done);
//   reduceGradients  this rank's slice of the flat buffer (collectives::SliceReduce): the average of
//                    each block of 1024 elements over the node's ranks' gradients, and (one node)
//                    the sum of its squares while the block is in cache; across nodes the loss
//                    vote runs over the world's MPI communicator meanwhile, and the slice is then
//                    averaged with the same local rank's slice on every other node over MPI (all of
//                    a node's links busy at once);
//   squaredNorm      the slice's Σ g² (across nodes, of the averaged slice);
//   reducePartials   an all-gather of the slices' (sum of squares, loss ballot) in the job segment,
//                    added in rank order: every rank has the gradient's global norm, the same bits,
//                    and the same verdict; a skipped step ends here on every rank, nothing updated;
//   update           the optimizer on the slice's parameters and (shared) optimizer state, block by
//                    block, scaling each gradient block by the clip coefficient first when clipping;
//   endStep          barrier "parameters" after an applied step: nobody reads a parameter or
//                    rewrites a gradient before every slice is done.
// Each element is updated by one rank of a node only, so there are no races and results are
// deterministic; across nodes every node applies the same averaged gradient to the same state, so
// the nodes' copies stay equal (replicas of the node's copy, as replicas of a worker's elsewhere).
// Local rank 0 initialises the parameters (across nodes, world rank 0's node's copy is then
// broadcast to the others); the optimizer state being one shared buffer per node, rank 0's
// checkpoint holds all of it, and each node's local rank 0 alone loads parameters and state on resume.
// Collectives: the node's barrier (and across nodes the world's over MPI); the rows of a reduce from
// the job segment, or across nodes from the world's all-gather.
// Ownership: owns its segments (and across nodes its MPI communicators). Thread safety: as Placement.
#pragma once

#include <memory>

#include "collectives/hierarchical/hierarchical_communicator.h"
#include "collectives/slice_reduce.h"
#include "ipc/shared_params.h"
#include "train/placement/segment_placement.h"

namespace cohort::train {

class SharedCopyPlacement final : public SegmentPlacement {
 public:
  // Every rank of the job constructs one, with the same model and optimizer. The optimizer must be
  // on the CPU; its state moves into the segment. A job across nodes passes the world's groups
  // (collectives::makeNodeGroups, with its cross-node communicators: every node the same size).
  explicit SharedCopyPlacement(const PlacementContext& context, collectives::NodeGroups groups = {});

  std::unique_ptr<JobCollectives> makeCollectives() override;
  uint64_t gradientReductions() const override { return reductions_; }
  SavedState saveState() override { return singleOptimizerState(optimizer_); }
  void loadState(const CheckpointReader& reader) override;

  void beginStep(const StepPlan& plan) override;
  void reduceGradients(const StepPlan& plan, LossVote& vote) override;
  PartialNorm squaredNorm(const StepPlan& plan) override;
  bool splitsGradient() const override { return true; }
  void reducePartials(std::span<double, 2> sumAndBallot) override;
  int gradientRank() const override { return -1; }  // the ranks' average
  void update(const StepPlan& plan, float clip) override;
  void endStep(const StepResult& result) override;

  int64_t sliceBegin() const { return reduce_->begin(); }
  int64_t sliceEnd() const { return reduce_->end(); }

 private:
  bool acrossNodes() const { return cross_ != nullptr; }
  // Across nodes: the node's barrier (naming a missing local worker), then the world's.
  void barrier(const std::string& what);

  std::unique_ptr<ipc::SharedParams> shared_;
  std::unique_ptr<collectives::Communicator> world_;  // across nodes only: every rank, over MPI
  std::unique_ptr<collectives::Communicator> cross_;  // across nodes only: this local rank of every node
  std::unique_ptr<collectives::SliceReduce> reduce_;
  uint64_t reductions_ = 0;
  double squares_ = 0;       // this step's Σ g² of the slice
  int64_t reduceStart_ = 0;  // timeline: when this step's reduction began
  float clip_ = 1.0f;        // this step's clip coefficient
  nn::Optimizer::BlockHook clipBlock_;
};

}  // namespace cohort::train
