#include "train/placement/shared_copy_placement.h"

#include <algorithm>
#include <vector>

#include "nn/grad_norm.h"
#include "runtime/error.h"
#include "train/step/step_pipeline.h"

namespace cohort::train {

SharedCopyPlacement::SharedCopyPlacement(const PlacementContext& c, collectives::NodeGroups groups)
    : SegmentPlacement(c, 0, groups.cross ? NodeScope::kEachNode : NodeScope::kOneNode),
      world_(std::move(groups.world)),
      cross_(std::move(groups.cross)) {
  COHORT_CHECK(!c.gpu) << "the shared-copy placement runs on the CPU";
  const int rank = localRank();
  shared_ = shareParams(c, params_.numel(), optimizer_.stateFloats());
  params_.placeGrads(shared_->perRank(rank));
  if (shared_->extraFloats() > 0) optimizer_.placeState(shared_->extra());
  std::vector<float*> grads;
  for (int r = 0; r < localWorldSize(); ++r) grads.push_back(shared_->perRank(r));
  reduce_ = std::make_unique<collectives::SliceReduce>(grads, rank, static_cast<int64_t>(params_.numel()));
  clipBlock_ = [this](int64_t b, int64_t e) {
    float* g = params_.grads().data();
    for (int64_t i = b; i < e; ++i) g[i] *= clip_;
  };
  if (acrossNodes()) {
    // Every node starts from world rank 0's node's copy (a program's own initialisation may differ
    // between nodes); local rank 0 is rank 0 of its cross-node communicator on node 0.
    if (rank == 0) cross_->broadcast(params_.values().data(), static_cast<size_t>(params_.numel()), 0)->wait(timeout_);
    nodeBarrier("the first node's parameters");
  }
}

std::unique_ptr<JobCollectives> SharedCopyPlacement::makeCollectives() {
  SegmentCollectivesOptions o = nodeCollectives();
  if (acrossNodes()) {
    o.barrier = [this](const std::string& what) { barrier(what); };
    o.gatherRows = [this](std::span<const double> mine, int& ranks) {
      ranks = world_->size();
      return gatherDoubles(*world_, mine, timeout_);
    };
  }
  return std::make_unique<SegmentCollectives>(std::move(o));
}

void SharedCopyPlacement::barrier(const std::string& what) {
  nodeBarrier(what);
  if (!acrossNodes()) return;
  Timeline::Scope span(timeline_, SpanKind::kBarrier);
  world_->barrier()->wait(timeout_);
}

void SharedCopyPlacement::beginStep(const StepPlan&) {
  COHORT_CHECK(params_.grads().data() == shared_->perRank(localRank()) && params_.values().data() == shared_->values())
      << "the shared-copy placement steps the segment's own parameters and gradients";
  nodeBarrier("gradients");
  reduceStart_ = timeline_.active() ? timeline_.now() : 0;
}

// This rank's slice of the averaged gradient, block by block, and (one node) the sum of its squares
// while each block is in cache. Across nodes the vote goes first on the world's communicator and is
// waited for before the slice's all-reduce across nodes: every rank then waits on one communicator
// at a time, so a wait that runs out names the ranks that stopped answering on it (a rank waiting
// on another communicator is not heard on this one: mpi_heartbeat.h).
void SharedCopyPlacement::reduceGradients(const StepPlan& plan, LossVote& vote) {
  if (acrossNodes()) vote.start(*world_);
  reduce_->setScale(plan.gradScale);
  ++reductions_;
  float* grads = params_.grads().data();
  squares_ = 0;
  constexpr int64_t kBlock = 1024;
  for (int64_t b = reduce_->begin(); b < reduce_->end(); b += kBlock) {
    const int64_t e = std::min(reduce_->end(), b + kBlock);
    reduce_->averageBlock(b, e);
    if (!acrossNodes()) squares_ += nn::sumOfSquares({grads + b, static_cast<size_t>(e - b)});
  }
  if (!acrossNodes()) return;
  vote.finish(timeout_);
  const auto slice = static_cast<size_t>(reduce_->end() - reduce_->begin());
  float* mine = grads + reduce_->begin();
  cross_->allReduce(mine, mine, slice, {.op = collectives::ReduceOp::kAvg})->wait(timeout_);
  squares_ = nn::sumOfSquares({mine, slice});
}

// The reduction already applied gradScale: the norm is the square root of the ranks' sum.
PartialNorm SharedCopyPlacement::squaredNorm(const StepPlan&) { return {.squares = squares_, .scale = 1.0f}; }

// Every local rank's (sum, ballot), added in rank order: the same norm and verdict everywhere.
// Across nodes every node's sum is the same for the same local rank, so the node's sum is the job's.
void SharedCopyPlacement::reducePartials(std::span<double, 2> sumAndBallot) {
  std::span<const double> all = segment_.allGather(sumAndBallot, {.what = "gradient norm", .timeout = nodeTimeout_});
  double total = 0, ballot = 0;
  for (int r = 0; r < localWorldSize(); ++r) {
    total += all[2 * static_cast<size_t>(r)];
    ballot = std::max(ballot, all[2 * static_cast<size_t>(r) + 1]);
  }
  sumAndBallot[0] = total;
  sumAndBallot[1] = ballot;
  if (timeline_.active()) {
    // As an all-reduce of the whole gradient: every rank reads every rank's part of its slice.
    const int64_t reduceEnd = timeline_.now();
    timeline_.record(SpanKind::kReduce, reduceStart_, reduceEnd);
    timeline_.addAllReduce(static_cast<double>(params_.numel() * sizeof(float)), reduceEnd - reduceStart_);
  }
}

// The update of the slice, clipped block by block while the block is in cache.
void SharedCopyPlacement::update(const StepPlan&, float clip) {
  clip_ = clip;
  static const nn::Optimizer::BlockHook kNone;
  Timeline::Scope span(timeline_, SpanKind::kOptimizer);
  optimizer_.stepSlice(params_.values(), params_.grads(), reduce_->begin(), reduce_->end(),
                       clip_ < 1.0f ? clipBlock_ : kNone);
}

// A skipped step is skipped alike on every rank: only this rank's own gradient area was written,
// which the next step's backward overwrites, so no barrier is needed.
void SharedCopyPlacement::endStep(const StepResult& result) {
  if (result.applied) nodeBarrier("parameters");
}

// One parameter copy and one optimizer state for the node: local rank 0 loads them before the
// others pass the barrier; every rank takes the step count.
void SharedCopyPlacement::loadState(const CheckpointReader& reader) {
  if (localRank() == 0) {
    loadParams(reader, params_);
    for (const auto& s : optimizer_.state()) reader.load("optimizer." + s.name, s.tensor);
  }
  optimizer_.setSteps(reader.count("optimizer_steps"));
  barrier("loaded");
}

}  // namespace cohort::train
