// ShardedSync: synchronous data-parallel training on one node over ONE shared copy of the
// parameters (--mode allreduce --backend shm when every rank is on this node; docs/nn.md).
//
// The arithmetic is that of all-reduce training (every step applies the average of all ranks'
// gradients, the same on every rank), but nothing is replicated: the parameters, every rank's
// gradients and the optimizer state live in one job segment (ipc::SharedParams: values, per-rank
// scratch, shared extra area). A step is
//   1. forward and backward on the shared parameters, gradients into this rank's scratch;
//   2. barrier "gradients";
//   3. this rank's shard [begin, end) of the flat buffer: for each block of 1024 elements, average
//      the block over all ranks' gradients (sum, then times 1/n), then apply the optimizer to that
//      block of the parameters and of the (shared) optimizer state;
//   4. barrier "parameters": nobody reads a parameter or rewrites a gradient before every shard is done.
// Each element is updated by one rank only, so there are no races and results are deterministic.
// Per step and rank this moves about the shard's gradients of the other ranks and nothing else,
// where replicas with an all-reduce copy every gradient several times and run the whole optimizer
// on every rank. The optimizer state being one shared buffer, rank 0's checkpoint holds all of it.
//
// Stop votes and averages go through the ranks' stats slots (`exchange`) between barriers.
// Ownership: borrows the segment, which must outlive it. Thread safety: the training thread only.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "nn/hogwild.h"

namespace cohort::nn {

// This rank's shard of a flat buffer of `numel` elements split over `ranks`: whole cache lines,
// the last shard shorter (possibly empty).
std::pair<int64_t, int64_t> shardOf(int64_t numel, int rank, int ranks);

// Creates (local rank 0) or attaches to the job segment and places the model's parameters and
// gradients and the optimizer's state in it; `initialise` runs on rank 0 as for shareParams().
std::unique_ptr<ipc::SharedParams> shareForShardedTraining(Model& model, Optimizer& optimizer, HogwildOptions options,
                                                           const std::function<void()>& initialise);

class ShardedSync final : public SegmentSync {
 public:
  ShardedSync(ipc::SharedParams& shared, std::chrono::milliseconds timeout);

  void shareOptimizerState(const Optimizer&) override {}
  std::vector<NamedTensor> gatheredOptimizerState(const Optimizer&) const override { return {}; }
  // One state (shared), one set of parameters: a checkpoint is rank 0's view of them.
  bool replicated() const override { return true; }
  void optimizerStep(Optimizer& optimizer, const Tensor& params, const Tensor& grads) override;
  bool anyRankStopping(bool thisRank) override;
  double averageOverRanks(double value) override;

  int64_t shardBegin() const { return begin_; }
  int64_t shardEnd() const { return end_; }

 private:
  // Every rank publishes `value` in its slot; returns all of them (rank order).
  const std::vector<int64_t>& exchange(int64_t value);

  int64_t begin_ = 0, end_ = 0;
  std::vector<const float*> sources_;  // gradients, this rank's first, then the others in rank order
  std::vector<int64_t> exchanged_;
  Optimizer::BlockHook averageBlock_;
};

}  // namespace cohort::nn
