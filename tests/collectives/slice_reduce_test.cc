// sliceOf: the slices of a flat buffer cover it exactly once, start on whole cache lines and differ
// in size by at most one line (the last may be shorter or empty). SliceReduce: each rank's blocks
// hold the scaled mean of every rank's buffer, exactly the shm all-reduce's average.
#include "collectives/slice_reduce.h"

#include <gtest/gtest.h>

#include <vector>

#include "runtime/error.h"

namespace cohort::collectives {
namespace {

TEST(SliceOf, SlicesCoverTheBufferOnceOnWholeCacheLines) {
  for (int64_t numel :
       {int64_t{0}, int64_t{1}, int64_t{15}, int64_t{16}, int64_t{17}, int64_t{50890}, int64_t{535818}}) {
    for (int ranks : {1, 2, 3, 4, 7}) {
      int64_t next = 0;
      for (int r = 0; r < ranks; ++r) {
        auto [begin, end] = sliceOf(numel, r, ranks);
        ASSERT_EQ(begin, next) << numel << " over " << ranks << ", rank " << r;
        ASSERT_LE(begin, end);
        if (begin < numel) EXPECT_EQ(begin % 16, 0);
        EXPECT_LE(end - begin, (numel + ranks - 1) / ranks + 15);
        next = end;
      }
      EXPECT_EQ(next, numel) << numel << " over " << ranks;
    }
  }
}

// Ranks as threads would do the same; here one thread plays every rank in turn (each writes only
// its own slice of its own buffer, so the order does not matter).
TEST(SliceReduce, EverySliceHoldsTheScaledMeanOfAllRanks) {
  for (int ranks : {1, 2, 3, 5}) {
    const int64_t numel = 1000;  // not a multiple of 16 * ranks
    std::vector<std::vector<float>> data(static_cast<size_t>(ranks), std::vector<float>(numel));
    for (int r = 0; r < ranks; ++r) {
      for (int64_t i = 0; i < numel; ++i)
        data[static_cast<size_t>(r)][static_cast<size_t>(i)] = static_cast<float>(r * 4 + i % 7);
    }
    std::vector<float*> buffers;
    for (auto& d : data) buffers.push_back(d.data());
    for (int r = 0; r < ranks; ++r) {
      SliceReduce reduce(buffers, r, numel, 0.5f);
      for (int64_t b = reduce.begin(); b < reduce.end(); b += 100)
        reduce.averageBlock(b, std::min(reduce.end(), b + 100));
    }
    for (int r = 0; r < ranks; ++r) {
      auto [begin, end] = sliceOf(numel, r, ranks);
      for (int64_t i = begin; i < end; ++i) {
        float sum = 0;
        for (int k = 0; k < ranks; ++k) sum += static_cast<float>(k * 4 + i % 7);
        ASSERT_EQ(data[static_cast<size_t>(r)][static_cast<size_t>(i)], sum * (1.0f / static_cast<float>(ranks) * 0.5f))
            << ranks << " ranks, rank " << r << ", element " << i;
      }
    }
  }
}

TEST(SliceReduce, TooManyRanksOrABadRankIsRefused) {
  std::vector<float> one(16);
  std::vector<float*> buffers(SliceReduce::kMaxRanks + 1, one.data());
  EXPECT_THROW(SliceReduce(buffers, 0, 16), InvalidArgument);
  std::vector<float*> two(2, one.data());
  EXPECT_THROW(SliceReduce(two, 2, 16), InvalidArgument);
}

}  // namespace
}  // namespace cohort::collectives
