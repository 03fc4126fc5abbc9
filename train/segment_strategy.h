// SegmentStrategy: what the one-node strategies (Hogwild, sharded) share: the job segment
// (ipc::JobSegment) that lines their ranks up. barrier() is its process barrier; reduce() goes
// through its all-gather of scalars. After the first barrier every rank has attached to every
// segment of the job, so local rank 0 removes their names then: a killed job leaves nothing in
// /dev/shm under srun or mpirun, where no launcher sweeps it (and a requeued SLURM job, which keeps
// its id, finds no stale segment).
// One node, or each node: the sharded strategy needs every rank on one node (NodeScope::kOneNode);
// Hogwild across nodes makes one per node (kEachNode), whose barrier() and reduce() are then the
// node's only (HogwildStrategy spans the world on top of them).
// Ownership: owns the job segment. Thread safety: as Strategy.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "ipc/job_segment.h"
#include "ipc/shared_params.h"
#include "train/strategy.h"

namespace cohort::train {

enum class NodeScope { kOneNode, kEachNode };

class SegmentStrategy : public Strategy {
 public:
  void barrier(const std::string& what) override;
  void reduce(std::span<double> values, ScalarOp op) override;
  bool sharedParams() const override { return true; }
  void abandon(const Error& error) override;

 protected:
  // Every local rank of the job constructs one (same options); with kOneNode all ranks must be on
  // this node (InvalidArgument otherwise).
  SegmentStrategy(const StrategyContext& context, size_t exchangeFloatsPerRank, NodeScope scope = NodeScope::kOneNode);
  // The parameters as one copy for the node, in a SharedParams segment with `perRankFloats` per
  // rank and `extraFloats` shared beside them: local rank 0 runs `initialise` (on the CPU) and
  // copies the values in before publishing it; every rank points its ParamBuffer there (gradients
  // and buffers stay private) and the segment's name goes after the first barrier.
  std::unique_ptr<ipc::SharedParams> shareParams(const StrategyContext& context, size_t perRankFloats,
                                                 size_t extraFloats);
  // Local rank 0 runs `unlink` after the first barrier (removing another segment's name).
  void unlinkAfterFirstBarrier(std::function<void()> unlink) { unlinks_.push_back(std::move(unlink)); }
  int localRank() const { return segment_.localRank(); }
  int localWorldSize() const { return segment_.localWorldSize(); }

  nn::ParamBuffer& params_;
  nn::Optimizer& optimizer_;
  runtime::cuda::GpuContext* gpu_;
  std::chrono::milliseconds timeout_;
  // Waits for the ranks of this node: timeout_, and half as long again when the job spans nodes, so
  // that a local rank stuck on the network times out first and abandon()s with the lost ranks'
  // names (graded timeouts: the inner wait runs out before the wait that waits for it).
  std::chrono::milliseconds nodeTimeout_;
  Timeline& timeline_;
  ipc::JobSegment segment_;

 private:
  std::vector<std::function<void()>> unlinks_;
  bool unlinked_ = false;
};

}  // namespace cohort::train
