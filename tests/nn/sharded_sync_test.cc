// shardOf: the shards of a flat buffer cover it exactly once, start on whole cache lines and differ
// in size by at most one line (the last may be shorter or empty).
#include "nn/sharded_sync.h"

#include <gtest/gtest.h>

namespace cohort::nn {
namespace {

TEST(ShardOf, ShardsCoverTheBufferOnceOnWholeCacheLines) {
  for (int64_t numel : {int64_t{0}, int64_t{1}, int64_t{15}, int64_t{16}, int64_t{17}, int64_t{50890}, int64_t{535818}}) {
    for (int ranks : {1, 2, 3, 4, 7}) {
      int64_t next = 0;
      for (int r = 0; r < ranks; ++r) {
        auto [begin, end] = shardOf(numel, r, ranks);
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

}  // namespace
}  // namespace cohort::nn
