// SharedParams (one parameter copy with per-rank and shared extra areas) and JobSegment (barrier,
// stats and exchange areas) across four forked processes.
#include "ipc/shared_params.h"

#include <algorithm>
#include <atomic>
#include <vector>

#include "gtest/gtest.h"
#include "ipc/job_segment.h"
#include "ipc/shm_names.h"
#include "tests/ipc/multiproc.h"

namespace cohort::ipc {
namespace {

using namespace std::chrono_literals;
using testing::forkChild;
using testing::freshJobId;
using testing::ScopedShmDir;
using testing::waitChild;

constexpr int kRanks = 4;
constexpr size_t kSlice = 1001;                 // floats per rank; odd, not a multiple of 64
constexpr size_t kNumel = kRanks * kSlice + 1;  // the last float is the common counter
constexpr size_t kScratch = 33;

SharedParams::Options optionsFor(const std::string& job, int rank) {
  return {.jobId = job, .localRank = rank, .localWorldSize = kRanks, .numel = kNumel, .perRankFloats = kScratch, .timeout = 30s};
}

JobSegment::Options segmentFor(const std::string& job, int rank) {
  return {.jobId = job, .localRank = rank, .localWorldSize = kRanks, .exchangeFloatsPerRank = kScratch, .timeout = 30s};
}

// Exactly representable values, distinct per rank and index.
float pattern(int rank, size_t i) { return static_cast<float>(rank * 10000 + static_cast<int>(i % 5000)); }

// What every rank does: write its slice and scratch, add rank + 1 to the counter, meet the others,
// then check everything every rank wrote. Returns 0 or a code naming the first failed check.
int runRank(JobSegment& job, SharedParams& params, int rank) {
  if (params.values()[0] != -1.f || params.values()[kNumel - 1] != 0.f) return 10;  // rank 0 initialised
  job.barrier().arriveAndWait(rank, {.what = "attached", .timeout = 30s});
  float* slice = params.values() + rank * kSlice;
  for (size_t i = 0; i < kSlice; ++i) slice[i] = pattern(rank, i);
  for (size_t i = 0; i < kScratch; ++i) params.perRank(rank)[i] = static_cast<float>(rank + 1);
  for (size_t i = 0; i < kScratch; ++i) job.exchange(rank)[i] = static_cast<float>(-rank - 1);
  std::atomic_ref<float> counter(params.values()[kNumel - 1]);
  counter.fetch_add(static_cast<float>(rank + 1));
  const double mine[2] = {1000.0 + rank, 64.0 * (rank + 1)};
  std::span<const double> all = job.allGather(mine, {.what = "written", .timeout = 30s});
  if (all.size() != 2 * kRanks) return 45;
  for (int r = 0; r < kRanks; ++r) {
    if (all[2 * r] != 1000.0 + r || all[2 * r + 1] != 64.0 * (r + 1)) return 40 + r;
  }
  // A second gather right after the first must not see the first one's values (two slot sets).
  const double again = -rank;
  all = job.allGather({&again, 1}, {.what = "again", .timeout = 30s});
  for (int r = 0; r < kRanks; ++r) {
    if (all[r] != -r) return 46;
  }
  for (int r = 0; r < kRanks; ++r) {
    for (size_t i = 0; i < kSlice; ++i) {
      if (params.values()[r * kSlice + i] != pattern(r, i)) return 20 + r;
    }
    for (size_t i = 0; i < kScratch; ++i) {
      if (params.perRank(r)[i] != static_cast<float>(r + 1)) return 30 + r;
      if (job.exchange(r)[i] != static_cast<float>(-r - 1)) return 60 + r;
    }
  }
  if (params.values()[kNumel - 1] != 1.f + 2.f + 3.f + 4.f) return 50;
  job.barrier().arriveAndWait(rank, {.what = "checked", .timeout = 30s});
  return 0;
}

TEST(SharedParams, FourProcessesShareOneBuffer) {
  ScopedShmDir dir;
  const std::string job = freshJobId();
  std::vector<pid_t> children;
  for (int rank = 1; rank < kRanks; ++rank) {
    children.push_back(forkChild([&, rank] {
      JobSegment segment(segmentFor(job, rank));
      SharedParams params(optionsFor(job, rank), nullptr);  // the initializer runs on rank 0 only
      return runRank(segment, params, rank);
    }));
  }
  int initialised = 0;
  JobSegment segment(segmentFor(job, 0));
  SharedParams params(optionsFor(job, 0), [&](float* values, size_t numel) {
    ++initialised;
    for (size_t i = 0; i < numel; ++i) values[i] = -1.f;
    values[numel - 1] = 0.f;
  });
  EXPECT_EQ(initialised, 1);
  EXPECT_EQ(params.numel(), kNumel);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(params.values()) % 64, 0u);
  for (int r = 0; r < kRanks; ++r) EXPECT_EQ(reinterpret_cast<uintptr_t>(params.perRank(r)) % 64, 0u);
  for (int r = 0; r < kRanks; ++r) EXPECT_EQ(reinterpret_cast<uintptr_t>(segment.exchange(r)) % 64, 0u);
  EXPECT_GE(params.perRank(1), params.perRank(0) + kScratch);
  EXPECT_GE(params.perRank(0), params.values() + kNumel);
  EXPECT_EQ(runRank(segment, params, 0), 0);
  for (pid_t c : children) EXPECT_EQ(waitChild(c), 0);
  std::vector<std::string> removed = removeJobSegments(job);
  std::sort(removed.begin(), removed.end());
  EXPECT_EQ(removed, (std::vector<std::string>{segmentName(job, "job"), segmentName(job, "params")}));
}

TEST(SharedParams, RanksWithDifferentOptionsAreRejected) {
  ScopedShmDir dir;
  const std::string job = freshJobId();
  SharedParams creator(optionsFor(job, 0), nullptr);
  auto other = optionsFor(job, 1);
  other.numel = kNumel + 1;
  other.timeout = 200ms;
  // A different size changes the segment's payload size, which open() reports right away.
  EXPECT_THROW(SharedParams(other, nullptr), IoError);
  other = optionsFor(job, 7);
  EXPECT_THROW(SharedParams(other, nullptr), InvalidArgument);
  JobSegment segment(segmentFor(job, 0));
  auto otherSegment = segmentFor(job, 1);
  otherSegment.exchangeFloatsPerRank = kScratch + 100;
  otherSegment.timeout = 200ms;
  EXPECT_THROW(JobSegment{otherSegment}, IoError);
}

TEST(SharedParams, OneRankAndEmptyBuffersWork) {
  ScopedShmDir dir;
  const std::string job = freshJobId();
  SharedParams params({.jobId = job, .numel = 0, .unlinkOnDestroy = true}, nullptr);
  EXPECT_EQ(params.numel(), 0u);
  JobSegment segment({.jobId = job, .unlinkOnDestroy = true});
  segment.barrier().arriveAndWait(0, {.what = "alone", .timeout = 1s});
  EXPECT_GT(SharedParams::segmentBytes({.jobId = job, .numel = 1000}), 1000 * sizeof(float));
}

}  // namespace
}  // namespace cohort::ipc
