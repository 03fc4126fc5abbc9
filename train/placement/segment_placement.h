// SegmentPlacement: what the shared-memory placements (Hogwild, the shared copy) share: the job
// segment (ipc::JobSegment) that lines their ranks up, and the node's side of their collectives.
// nodeBarrier() is its process barrier; gatherNode() its all-gather of scalars. After the first
// barrier every rank has attached to every segment of the job, so local rank 0 removes their names
// then: a killed job leaves nothing in /dev/shm under srun or mpirun, where no launcher sweeps it
// (and a requeued SLURM job, which keeps its id, finds no stale segment).
// One node, or each node: the shared copy on one node needs every rank there (NodeScope::kOneNode);
// Hogwild across nodes and the shared copy across nodes make one per node (kEachNode), whose node
// barrier and gather are then the node's only (the placement spans the world on top of them, in
// the SegmentCollectives it makes).
// Ownership: owns the job segment. Thread safety: as Placement.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "ipc/job_segment.h"
#include "ipc/shared_params.h"
#include "train/placement/placement.h"

namespace cohort::train {

enum class NodeScope { kOneNode, kEachNode };

// A shared-memory placement's collectives: its node barrier, then what spans the world (a
// communicator's barrier, Hogwild's averaging meeting); the rows from the job segment on one node or
// from the world's gather across nodes. Every function borrows the placement (destroy this first).
struct SegmentCollectivesOptions {
  std::function<void(const std::string& what)> barrier;
  std::function<std::vector<double>(std::span<const double> mine, int& ranks)> gatherRows;
  std::function<void(const Error& error)> abandon;
  std::function<void(std::chrono::milliseconds settle)> checkPeers = {};  // none: nothing to check
  bool lockstep = true;
};

class SegmentCollectives final : public JobCollectives {
 public:
  explicit SegmentCollectives(SegmentCollectivesOptions options) : o_(std::move(options)) {}
  void barrier(const std::string& what) override { o_.barrier(what); }
  bool lockstep() const override { return o_.lockstep; }
  void checkPeers(std::chrono::milliseconds settle) override {
    if (o_.checkPeers) o_.checkPeers(settle);
  }
  void abandon(const Error& error) override { o_.abandon(error); }

 protected:
  std::vector<double> gatherRows(std::span<const double> mine, int& ranks) override {
    return o_.gatherRows(mine, ranks);
  }

 private:
  SegmentCollectivesOptions o_;
};

class SegmentPlacement : public Placement {
 public:
  bool sharedParams() const override { return true; }
  // The node's barrier: every local rank, same names, same order (a kBarrier span).
  void nodeBarrier(const std::string& what);
  // Every local rank's `mine`, rank-major, through the job segment (any size: in parts of
  // ipc::JobSegment::kMaxScalars).
  std::vector<double> gatherNode(std::span<const double> mine, int& ranks);
  // The node's collectives, for a placement whose job is this node.
  SegmentCollectivesOptions nodeCollectives();

 protected:
  // Every local rank of the job constructs one (same options); with kOneNode all ranks must be on
  // this node (InvalidArgument otherwise).
  SegmentPlacement(const PlacementContext& context, size_t exchangeFloatsPerRank, NodeScope scope = NodeScope::kOneNode);
  // The parameters as one copy for the node, in a SharedParams segment with `perRankFloats` per
  // rank and `extraFloats` shared beside them: local rank 0 runs `initialise` (on the CPU) and
  // copies the values in before publishing it; every rank points its ParamBuffer there (gradients
  // and buffers stay private) and the segment's name goes after the first barrier.
  std::unique_ptr<ipc::SharedParams> shareParams(const PlacementContext& context, size_t perRankFloats,
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
  // that a local rank stuck on the network times out first and abandons with the lost ranks'
  // names (graded timeouts: the inner wait runs out before the wait that waits for it).
  std::chrono::milliseconds nodeTimeout_;
  Timeline& timeline_;
  ipc::JobSegment segment_;

 private:
  std::vector<std::function<void()>> unlinks_;
  bool unlinked_ = false;
};

}  // namespace cohort::train
