#include "collectives/slice_reduce.h"

#include <algorithm>

#include "collectives/shm/reduce_kernels.h"
#include "runtime/error.h"

namespace cohort::collectives {

static_assert(SliceReduce::kMaxRanks <= shm::kMaxSources);

std::pair<int64_t, int64_t> sliceOf(int64_t numel, int rank, int ranks) {
  constexpr int64_t kLineFloats = 16;
  const int64_t per = ((numel + ranks - 1) / ranks + kLineFloats - 1) / kLineFloats * kLineFloats;
  const int64_t begin = std::min(numel, per * rank);
  return {begin, std::min(numel, begin + per)};
}

SliceReduce::SliceReduce(std::span<float* const> buffers, int rank, int64_t numel, float scale)
    : ranks_(static_cast<int>(buffers.size())), scale_(scale) {
  if (ranks_ < 1 || ranks_ > kMaxRanks || rank < 0 || rank >= ranks_) {
    COHORT_THROW(InvalidArgument) << "slice reduction over " << ranks_ << " ranks (at most " << kMaxRanks
                                  << ") for rank " << rank;
  }
  mine_ = buffers[static_cast<size_t>(rank)];
  sources_.push_back(mine_);
  for (int r = 0; r < ranks_; ++r) {
    if (r != rank) sources_.push_back(buffers[static_cast<size_t>(r)]);
  }
  std::tie(begin_, end_) = sliceOf(numel, rank, ranks_);
}

void SliceReduce::averageBlock(int64_t begin, int64_t end) const {
  COHORT_CHECK(begin_ <= begin && begin <= end && end <= end_)
      << "[" << begin << ", " << end << ") outside the slice [" << begin_ << ", " << end_ << ")";
  const float* blockSources[kMaxRanks];
  for (size_t s = 0; s < sources_.size(); ++s) blockSources[s] = sources_[s] + begin;
  shm::reduceInto(mine_ + begin, blockSources, ranks_, static_cast<size_t>(end - begin), ReduceOp::kAvg,
                  1.0f / static_cast<float>(ranks_) * scale_);
}

}  // namespace cohort::collectives
