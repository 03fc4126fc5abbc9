// A collective in steady state allocates nothing on the shm backend (issue 33): its Work comes from
// the communicator's pool and its queue links the Works themselves (collectives/work_pool.h). This
// binary replaces the global operator new to count allocations. Each rank is a forked process that
// counts its own, the issuing thread's and the progress thread's, over rounds of every collective
// at small counts, after warm-up rounds that grew the pool to the depth the rounds use.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <string>
#include <vector>

#include "collectives/communicator.h"
#include "collectives/shm/shm_communicator.h"
#include "runtime/world_info.h"
#include "tests/ipc/multiproc.h"

namespace {

std::atomic<unsigned long long> gAllocations{0};

void* countedAllocation(std::size_t bytes, std::size_t alignment) {
  gAllocations.fetch_add(1, std::memory_order_relaxed);
  const std::size_t size = (bytes + alignment - 1) / alignment * alignment;
  void* p = alignment <= alignof(std::max_align_t) ? std::malloc(bytes == 0 ? 1 : bytes)
                                                   : std::aligned_alloc(alignment, size == 0 ? alignment : size);
  if (p == nullptr) throw std::bad_alloc();
  return p;
}

}  // namespace

// The other forms (arrays, nothrow) come here through these in libstdc++.
void* operator new(std::size_t bytes) { return countedAllocation(bytes, alignof(std::max_align_t)); }
void* operator new(std::size_t bytes, std::align_val_t alignment) {
  return countedAllocation(bytes, static_cast<std::size_t>(alignment));
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }

namespace cohort::collectives {
namespace {

using ipc::testing::forkChild;
using ipc::testing::freshJobId;
using ipc::testing::ScopedShmDir;
using ipc::testing::waitChild;

constexpr std::chrono::seconds kTimeout{20};
constexpr size_t kCounts[] = {0, 1, 16, 256};
constexpr size_t kMaxCount = 256;
constexpr int kDepth = 4;  // collectives in flight at once in a round
constexpr int kWarmupRounds = 5;
constexpr int kRounds = 40;
constexpr int kWindows = 3;

// Every collective at every count, one at a time, then kDepth all-reduces in flight. Rank r's input
// is all r + 1, so every result is a small integer.
void round(Communicator& comm, std::vector<float>& input, std::vector<float>& output) {
  for (size_t count : kCounts) {
    comm.allReduce(input.data(), output.data(), count, {.op = ReduceOp::kSum})->wait(kTimeout);
    comm.reduceScatter(input.data(), output.data(), count, {.op = ReduceOp::kMax})->wait(kTimeout);
    comm.allGather(input.data(), output.data(), count, {})->wait(kTimeout);
    comm.broadcast(output.data(), count, 0)->wait(kTimeout);
  }
  comm.barrier()->wait(kTimeout);
  std::array<WorkPtr, kDepth> works;
  for (WorkPtr& work : works) work = comm.allReduce(input.data(), output.data(), kMaxCount, {.op = ReduceOp::kSum});
  for (WorkPtr& work : works) work->wait(kTimeout);
}

// A rank's part: 0 when its steady-state rounds allocated nothing and the last sum is right.
int rankAllocatingNothing(int rank, int worldSize, const std::string& jobId) {
  runtime::WorldInfo world{
      .rank = rank, .worldSize = worldSize, .localRank = rank, .localWorldSize = worldSize, .jobId = jobId};
  auto comm = makeShmCommunicator({.backend = "shm", .world = world, .timeout = kTimeout});
  std::vector<float> input(kMaxCount * static_cast<size_t>(worldSize), static_cast<float>(rank + 1));
  std::vector<float> output(input.size());
  for (int i = 0; i < kWarmupRounds; ++i) round(*comm, input, output);
  // The fewest over a few windows: a rank that sleeps on a late peer for 20 ms checks that the peers
  // are alive, reading /proc (shm_waiter.h), which allocates; that is time-driven, not per call, and
  // a window without such a stall still shows a per-call allocation (old code: two per collective).
  unsigned long long allocations = ~0ull;
  for (int window = 0; window < kWindows; ++window) {  // as many on every rank: they are collective
    const unsigned long long before = gAllocations.load();
    for (int i = 0; i < kRounds; ++i) round(*comm, input, output);
    allocations = std::min(allocations, gAllocations.load() - before);
  }
  const int collectives = kRounds * (4 * static_cast<int>(std::size(kCounts)) + 1 + kDepth);
  const float sum = static_cast<float>(worldSize * (worldSize + 1) / 2);
  for (size_t i = 0; i < kMaxCount; ++i) {
    if (output[i] != sum) {
      std::fprintf(stderr, "rank %d: element %zu of the last all-reduce is %g, not %g\n", rank, i, output[i], sum);
      return 2;
    }
  }
  if (allocations == 0) return 0;
  std::fprintf(stderr, "rank %d of %d: %llu allocations in %d steady-state collectives\n", rank, worldSize, allocations,
               collectives);
  return 1;
}

TEST(ShmAllocation, SteadyStateCollectivesAllocateNothing) {
  for (int worldSize : {1, 2, 3}) {
    ScopedShmDir shmDir;
    const std::string jobId = freshJobId();
    std::vector<pid_t> children;
    for (int r = 0; r < worldSize; ++r) {
      children.push_back(forkChild([=] { return rankAllocatingNothing(r, worldSize, jobId); }));
    }
    for (int r = 0; r < worldSize; ++r) {
      EXPECT_EQ(waitChild(children[r], std::chrono::seconds(60)), 0)
          << "rank " << r << " of " << worldSize << " (1: it allocated; its count is on stderr)";
    }
  }
}

}  // namespace
}  // namespace cohort::collectives
