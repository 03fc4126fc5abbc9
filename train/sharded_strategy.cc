#include "train/sharded_strategy.h"

#include <algorithm>
#include <vector>

#include "runtime/error.h"

namespace cohort::train {

ShardedStrategy::ShardedStrategy(const StrategyContext& c) : SegmentStrategy(c, 0) {
  COHORT_CHECK(!c.gpu) << "the sharded strategy runs on the CPU";
  const int rank = localRank();
  shared_ = shareParams(c, params_.numel(), optimizer_.stateFloats());
  params_.placeGrads(shared_->perRank(rank));
  if (shared_->extraFloats() > 0) optimizer_.placeState(shared_->extra());
  std::vector<float*> grads;
  for (int r = 0; r < localWorldSize(); ++r) grads.push_back(shared_->perRank(r));
  reduce_ = std::make_unique<collectives::ShardReduce>(grads, rank, static_cast<int64_t>(params_.numel()));
  averageBlock_ = [this](int64_t b, int64_t e) { reduce_->averageBlock(b, e); };
}

void ShardedStrategy::step(float gradScale) {
  COHORT_CHECK(params_.grads().data() == shared_->perRank(localRank()) && params_.values().data() == shared_->values())
      << "the sharded strategy steps the segment's own parameters and gradients";
  barrier("gradients");
  reduce_->setScale(gradScale);
  ++reductions_;
  optimizer_.stepSlice(params_.values(), params_.grads(), reduce_->begin(), reduce_->end(), averageBlock_);
  barrier("parameters");
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
