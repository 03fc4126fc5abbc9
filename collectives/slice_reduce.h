// SliceReduce: the gradient reduction of the one-shared-copy-per-node placement on one node
// (train/placement/shared_copy_placement.h), where every local rank's gradients lie in shared memory that every
// rank maps. ("Slice", not "shard": in Cohort a shard is only ZeRO's, nn/shard_map.h.)
//
// Each rank owns one slice of the flat buffer, sliceOf(numel, rank, ranks): whole cache lines,
// about 1/ranks of it. After a barrier that ends every rank's backward, a rank averages its own
// slice block by block: averageBlock(begin, end) writes into this rank's buffer, at [begin, end),
// the mean over all ranks' buffers (this rank's first, then the others in rank order; summed, then
// multiplied by float(1/ranks) times `scale`) — the arithmetic of the shm all-reduce's average, so
// results equal the replicas' that all-reduce with it. The caller steps the optimizer on each block
// while it is hot in the cache (nn::Optimizer::stepSlice), which is why this is a block operation
// rather than a Communicator collective: nothing is staged or copied, and no progress thread runs.
// No rank may write a buffer while others read it: the barriers around the step order that.
//
// Ownership: borrows the buffers (shared memory the caller keeps mapped). Thread safety: one thread
// per rank; the ranks' calls touch disjoint slices of their own buffers.
//
//   SliceReduce reduce(gradientsOfEveryRank, localRank, numel);
//   optimizer.stepSlice(params, grads, reduce.begin(), reduce.end(),
//                       [&](int64_t b, int64_t e) { reduce.averageBlock(b, e); });
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

namespace cohort::collectives {

// This rank's slice [begin, end) of a flat buffer of `numel` elements split over `ranks`: slices
// start on whole cache lines (16 floats) and tile the buffer; the last is shorter, possibly empty.
std::pair<int64_t, int64_t> sliceOf(int64_t numel, int rank, int ranks);

class SliceReduce {
 public:
  static constexpr int kMaxRanks = 64;

  // `buffers[r]` is rank r's buffer of `numel` floats, as this process maps it. InvalidArgument for
  // more than kMaxRanks ranks or a rank outside them.
  SliceReduce(std::span<float* const> buffers, int rank, int64_t numel, float scale = 1.0f);

  int64_t begin() const { return begin_; }
  int64_t end() const { return end_; }
  // buffers[rank][i] = scale · mean over ranks of buffers[r][i], for i in [begin, end) ⊂ the slice.
  void averageBlock(int64_t begin, int64_t end) const;
  // Sets the extra factor (e.g. 1/K for K accumulated micro-batches).
  void setScale(float scale) { scale_ = scale; }

 private:
  std::vector<const float*> sources_;  // this rank's buffer first, then the others in rank order
  float* mine_;
  int ranks_;
  int64_t begin_ = 0, end_ = 0;
  float scale_;
};

}  // namespace cohort::collectives
