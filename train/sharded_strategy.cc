#include "train/sharded_strategy.h"

#include <algorithm>
#include <vector>

#include <cmath>

#include "nn/grad_norm.h"
#include "runtime/error.h"

namespace cohort::train {

ShardedStrategy::ShardedStrategy(const StrategyContext& c, collectives::NodeGroups groups)
    : SegmentStrategy(c, 0, groups.cross ? NodeScope::kEachNode : NodeScope::kOneNode),
      world_(std::move(groups.world)),
      cross_(std::move(groups.cross)),
      rank_(c.world.rank),
      worldSize_(c.world.worldSize) {
  COHORT_CHECK(!c.gpu) << "the sharded strategy runs on the CPU";
  const int rank = localRank();
  shared_ = shareParams(c, params_.numel(), optimizer_.stateFloats());
  params_.placeGrads(shared_->perRank(rank));
  if (shared_->extraFloats() > 0) optimizer_.placeState(shared_->extra());
  std::vector<float*> grads;
  for (int r = 0; r < localWorldSize(); ++r) grads.push_back(shared_->perRank(r));
  reduce_ = std::make_unique<collectives::ShardReduce>(grads, rank, static_cast<int64_t>(params_.numel()));
  clipBlock_ = [this](int64_t b, int64_t e) {
    float* g = params_.grads().data();
    for (int64_t i = b; i < e; ++i) g[i] *= clip_;
  };
  if (acrossNodes()) {
    // Every node starts from world rank 0's node's copy (a program's own initialisation may differ
    // between nodes); local rank 0 is rank 0 of its cross-node communicator on node 0.
    if (rank == 0) cross_->broadcast(params_.values().data(), static_cast<size_t>(params_.numel()), 0)->wait(timeout_);
    SegmentStrategy::barrier("the first node's parameters");
  }
}

StepResult ShardedStrategy::step(const StepPlan& plan) {
  COHORT_CHECK(params_.grads().data() == shared_->perRank(localRank()) && params_.values().data() == shared_->values())
      << "the sharded strategy steps the segment's own parameters and gradients";
  SegmentStrategy::barrier("gradients");
  const int64_t reduceStart = timeline_.active() ? timeline_.now() : 0;
  collectives::WorkPtr flagWork;
  if (acrossNodes() && plan.exchangeLoss) {
    lossFlag_ = LossVerdict::vote(plan.loss, rank_, worldSize_);
    flagWork = world_->allReduce(&lossFlag_, &lossFlag_, 1, {.op = collectives::ReduceOp::kMax});
  }
  // 1. This rank's shard of the averaged gradient, block by block, and the sum of its squares
  //    (across nodes, once the shard is averaged with the other nodes' too).
  reduce_->setScale(plan.gradScale);
  ++reductions_;
  float* grads = params_.grads().data();
  double squares = 0;
  constexpr int64_t kBlock = 1024;
  for (int64_t b = reduce_->begin(); b < reduce_->end(); b += kBlock) {
    const int64_t e = std::min(reduce_->end(), b + kBlock);
    reduce_->averageBlock(b, e);
    if (!acrossNodes()) squares += nn::sumOfSquares({grads + b, static_cast<size_t>(e - b)});
  }
  LossVerdict loss;
  if (acrossNodes()) {
    // The flags first: every rank then waits on one communicator at a time, so a wait that runs out
    // names the ranks that stopped answering on it (a rank waiting on another communicator is not
    // heard on this one: mpi_heartbeat.h).
    if (flagWork) {
      flagWork->wait(timeout_);
      loss = LossVerdict::ofVotes(lossFlag_, worldSize_);
    }
    const auto shard = static_cast<size_t>(reduce_->end() - reduce_->begin());
    float* mine = grads + reduce_->begin();
    cross_->allReduce(mine, mine, shard, {.op = collectives::ReduceOp::kAvg})->wait(timeout_);
    squares = nn::sumOfSquares({mine, shard});
  }
  // 2. Every rank's sum and loss vote, added in rank order: the same norm and verdict everywhere.
  const double mine[2] = {squares, LossVerdict::vote(plan.loss, localRank(), localWorldSize())};
  std::span<const double> all = segment_.allGather(mine, {.what = "gradient norm", .timeout = nodeTimeout_});
  double total = 0, vote = 0;
  for (int r = 0; r < localWorldSize(); ++r) {
    total += all[2 * static_cast<size_t>(r)];
    vote = std::max(vote, all[2 * static_cast<size_t>(r) + 1]);
  }
  if (!acrossNodes()) loss = LossVerdict::ofVotes(static_cast<float>(vote), localWorldSize());
  StepResult result = judgeStep(std::sqrt(total), loss, -1, plan.maxGradNorm);
  if (timeline_.active()) {
    // As an all-reduce of the whole gradient: every rank reads every rank's part of its shard.
    const int64_t reduceEnd = timeline_.now();
    timeline_.record(SpanKind::kReduce, reduceStart, reduceEnd);
    timeline_.addAllReduce(static_cast<double>(params_.numel() * sizeof(float)), reduceEnd - reduceStart);
  }
  // Skipped alike on every rank: only this rank's own gradient area was written, which the next
  // step's backward overwrites.
  if (!result.applied) return result;
  // 3. The update of the shard (clipped block by block while the block is in cache), then every shard's.
  clip_ = plan.clipGradNorm > 0 ? nn::clipCoefficient(result.gradNorm, plan.clipGradNorm) : 1.0f;
  static const nn::Optimizer::BlockHook kNone;
  {
    Timeline::Scope span(timeline_, SpanKind::kOptimizer);
    optimizer_.stepSlice(params_.values(), params_.grads(), reduce_->begin(), reduce_->end(), clip_ < 1.0f ? clipBlock_ : kNone);
  }
  SegmentStrategy::barrier("parameters");
  return result;
}

void ShardedStrategy::barrier(const std::string& what) {
  SegmentStrategy::barrier(what);
  if (!acrossNodes()) return;
  Timeline::Scope span(timeline_, SpanKind::kBarrier);
  world_->barrier()->wait(timeout_);
}

void ShardedStrategy::reduce(std::span<double> values, ScalarOp op) {
  if (!acrossNodes()) return SegmentStrategy::reduce(values, op);
  const std::vector<double> all = gatherDoubles(*world_, values, timeout_);
  reduceRows(values, all, worldSize_, op);
}

// One parameter copy and one optimizer state for the node: local rank 0 loads them before the
// others pass the barrier; every rank takes the step count.
void ShardedStrategy::loadState(const CheckpointReader& reader) {
  if (localRank() == 0) {
    loadParams(reader, params_);
    for (const auto& s : optimizer_.state()) reader.load("optimizer." + s.name, s.tensor);
  }
  optimizer_.setSteps(reader.count("optimizer_steps"));
  barrier("loaded");
}

}  // namespace cohort::train
