#include "nn/sharded_sync.h"

#include <algorithm>
#include <bit>

#include "collectives/shm/reduce_kernels.h"
#include "runtime/error.h"

namespace cohort::nn {

std::pair<int64_t, int64_t> shardOf(int64_t numel, int rank, int ranks) {
  constexpr int64_t kLineFloats = 16;
  const int64_t per = ((numel + ranks - 1) / ranks + kLineFloats - 1) / kLineFloats * kLineFloats;
  const int64_t begin = std::min(numel, per * rank);
  return {begin, std::min(numel, begin + per)};
}

std::unique_ptr<ipc::SharedParams> shareForShardedTraining(Model& model, Optimizer& optimizer, HogwildOptions options,
                                                           const std::function<void()>& initialise) {
  options.scratchFloatsPerRank = model.params.numel();
  options.extraFloats = optimizer.stateFloats();
  auto shared = shareParams(model, options, initialise);
  model.params.placeGrads(shared->scratch(options.localRank));
  if (options.extraFloats > 0) optimizer.placeState(shared->extra());
  return shared;
}

ShardedSync::ShardedSync(ipc::SharedParams& shared, std::chrono::milliseconds timeout) : SegmentSync(shared, timeout) {
  const int rank = shared.localRank(), ranks = shared.localWorldSize();
  COHORT_CHECK(ranks <= collectives::shm::kMaxSources) << ranks << " ranks";
  std::tie(begin_, end_) = shardOf(static_cast<int64_t>(shared.numel()), rank, ranks);
  sources_.push_back(shared.scratch(rank));
  for (int r = 0; r < ranks; ++r) {
    if (r != rank) sources_.push_back(shared.scratch(r));
  }
  exchanged_.resize(static_cast<size_t>(ranks));
  float* mine = shared.scratch(rank);
  averageBlock_ = [this, mine, ranks](int64_t b, int64_t e) {
    const float* blockSources[collectives::shm::kMaxSources];
    for (size_t s = 0; s < sources_.size(); ++s) blockSources[s] = sources_[s] + b;
    collectives::shm::reduceInto(mine + b, blockSources, ranks, static_cast<size_t>(e - b), collectives::ReduceOp::kAvg,
                                 1.0f / static_cast<float>(ranks));
  };
}

void ShardedSync::optimizerStep(Optimizer& optimizer, const Tensor& params, const Tensor& grads) {
  COHORT_CHECK(grads.data() == shared_.scratch(shared_.localRank()) && params.data() == shared_.values())
      << "ShardedSync steps the segment's own parameters and gradients";
  barrier("gradients");
  optimizer.stepSlice(params, grads, begin_, end_, averageBlock_);
  barrier("parameters");
}

const std::vector<int64_t>& ShardedSync::exchange(int64_t value) {
  // Slots are rewritten only after the barrier that follows everyone's reading (the next barrier of
  // any kind), so one barrier before reading is enough.
  shared_.stats(shared_.localRank()).exchange.store(value, std::memory_order_relaxed);
  barrier("exchange");
  for (int r = 0; r < shared_.localWorldSize(); ++r) {
    exchanged_[static_cast<size_t>(r)] = shared_.stats(r).exchange.load(std::memory_order_relaxed);
  }
  return exchanged_;
}

bool ShardedSync::anyRankStopping(bool thisRank) {
  const auto& votes = exchange(thisRank ? 1 : 0);
  return std::any_of(votes.begin(), votes.end(), [](int64_t v) { return v != 0; });
}

double ShardedSync::averageOverRanks(double value) {
  double sum = 0;
  for (int64_t bits : exchange(std::bit_cast<int64_t>(value))) sum += std::bit_cast<double>(bits);
  barrier("exchanged");  // the next exchange() may come before any other barrier
  return sum / static_cast<double>(shared_.localWorldSize());
}

}  // namespace cohort::nn
