// CudaCachingAllocator and PinnedHostAllocator on a real device (tags = ["gpu"]). Without a device
// (or without CUDA compiled in) the device tests skip with the reason.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "runtime/error.h"
#include "tests/runtime/cuda/gpu_test_util.h"

#ifdef COHORT_HAVE_CUDA
#include <cuda_runtime.h>

#include "runtime/cuda/caching_allocator.h"
#include "runtime/cuda/pinned_allocator.h"
#include "runtime/cuda/workspace.h"

namespace cohort::runtime::cuda {
namespace {

constexpr size_t kMiB = size_t{1} << 20;

// Needs no device: pure arithmetic.
TEST(CachingAllocatorRounding, SmallTo512LargeTo2MiB) {
  EXPECT_EQ(CudaCachingAllocator::roundSize(0), 0u);
  EXPECT_EQ(CudaCachingAllocator::roundSize(1), 512u);
  EXPECT_EQ(CudaCachingAllocator::roundSize(512), 512u);
  EXPECT_EQ(CudaCachingAllocator::roundSize(513), 1024u);
  EXPECT_EQ(CudaCachingAllocator::roundSize(kMiB), kMiB);
  EXPECT_EQ(CudaCachingAllocator::roundSize(kMiB + 1), 2 * kMiB);
  EXPECT_EQ(CudaCachingAllocator::roundSize(3 * kMiB), 4 * kMiB);
  EXPECT_EQ(CudaCachingAllocator::roundSize(4 * kMiB), 4 * kMiB);
}

TEST(CachingAllocatorDevice, RejectsCpu) {
  EXPECT_THROW(CudaCachingAllocator(Device::cpu()), InvalidArgument);
}

class CachingAllocatorTest : public ::testing::Test {
 protected:
  void SetUp() override { COHORT_SKIP_WITHOUT_CUDA_DEVICE(); }
};

TEST_F(CachingAllocatorTest, StatsFollowAllocFreeAndReuse) {
  CudaCachingAllocator alloc(Device::cuda(0));
  EXPECT_EQ(alloc.device(), Device::cuda(0));
  EXPECT_EQ(alloc.allocate(0), nullptr);
  void* a = alloc.allocate(1000);
  ASSERT_NE(a, nullptr);
  AllocatorStats s = alloc.stats();
  EXPECT_EQ(s.allocatedBytes, 1024u);
  EXPECT_EQ(s.reservedBytes, 1024u);
  EXPECT_EQ(s.allocationCount, 1u);
  EXPECT_EQ(s.systemAllocations, 1u);

  // The memory is real device memory.
  ASSERT_EQ(cudaMemset(a, 0x5a, 1000), cudaSuccess);
  std::vector<unsigned char> host(1000);
  ASSERT_EQ(cudaMemcpy(host.data(), a, 1000, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(host[0], 0x5a);
  EXPECT_EQ(host[999], 0x5a);

  alloc.deallocate(a, 1000);
  s = alloc.stats();
  EXPECT_EQ(s.allocatedBytes, 0u);
  EXPECT_EQ(s.reservedBytes, 1024u);  // cached, not returned

  void* b = alloc.allocate(900);  // same 1024-byte class: served from the cache
  EXPECT_EQ(b, a);
  s = alloc.stats();
  EXPECT_EQ(s.allocatedBytes, 1024u);
  EXPECT_EQ(s.allocationCount, 2u);
  EXPECT_EQ(s.systemAllocations, 1u);
  alloc.deallocate(b, 900);
}

// The mistake the first GPU run found in `cohort bench train`: a tensor that outlives its allocator
// frees into a destroyed object later. The allocator names it where it happens, on every device.
TEST_F(CachingAllocatorTest, DestroyingItWithABlockHandedOutIsNamed) {
  // A death test runs this binary again, which hangs under compute-sanitizer (scripts/gpu_run.sh).
  const char* sanitizer = std::getenv("COHORT_GPU_TEST_UNDER_SANITIZER");
  if (sanitizer && *sanitizer == '1') GTEST_SKIP() << "a death test, not run under compute-sanitizer";
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        CudaCachingAllocator alloc(Device::cuda(0));
        alloc.allocate(3000);
        alloc.allocate(5 * kMiB);
      },
      "caching allocator of cuda:0 is destroyed while 2 of its blocks \\(6294528 bytes\\) are still handed out");
  // Freed in time, the same allocations end quietly.
  CudaCachingAllocator alloc(Device::cuda(0));
  alloc.deallocate(alloc.allocate(3000), 3000);
}

TEST_F(CachingAllocatorTest, LargeBlocksBestFitWithinTwiceTheSize) {
  CudaCachingAllocator alloc(Device::cuda(0));
  void* big = alloc.allocate(3 * kMiB);  // -> 4 MiB
  EXPECT_EQ(alloc.stats().reservedBytes, 4 * kMiB);
  alloc.deallocate(big, 3 * kMiB);

  void* again = alloc.allocate(3 * kMiB + 100);  // still 4 MiB: reused
  EXPECT_EQ(again, big);
  EXPECT_EQ(alloc.stats().systemAllocations, 1u);
  alloc.deallocate(again, 3 * kMiB + 100);

  void* half = alloc.allocate(2 * kMiB);  // a 4 MiB block would waste half: fresh cudaMalloc
  EXPECT_NE(half, big);
  AllocatorStats s = alloc.stats();
  EXPECT_EQ(s.systemAllocations, 2u);
  EXPECT_EQ(s.allocatedBytes, 2 * kMiB);
  EXPECT_EQ(s.reservedBytes, 6 * kMiB);

  void* small = alloc.allocate(512);  // small requests never take large blocks
  EXPECT_NE(small, big);
  EXPECT_EQ(alloc.stats().systemAllocations, 3u);
  alloc.deallocate(small, 512);
  alloc.deallocate(half, 2 * kMiB);
}

TEST_F(CachingAllocatorTest, PeaksAndReset) {
  CudaCachingAllocator alloc(Device::cuda(0));
  void* a = alloc.allocate(4 * kMiB);
  void* b = alloc.allocate(2 * kMiB);
  alloc.deallocate(a, 4 * kMiB);
  AllocatorStats s = alloc.stats();
  EXPECT_EQ(s.allocatedBytes, 2 * kMiB);
  EXPECT_EQ(s.peakAllocatedBytes, 6 * kMiB);
  EXPECT_EQ(s.peakReservedBytes, 6 * kMiB);

  alloc.resetPeakStats();
  s = alloc.stats();
  EXPECT_EQ(s.peakAllocatedBytes, 2 * kMiB);
  EXPECT_EQ(s.peakReservedBytes, 6 * kMiB);  // the cached 4 MiB block is still reserved

  alloc.emptyCache();
  s = alloc.stats();
  EXPECT_EQ(s.reservedBytes, 2 * kMiB);
  EXPECT_EQ(s.peakReservedBytes, 6 * kMiB);  // peaks only drop on reset
  alloc.deallocate(b, 2 * kMiB);
}

TEST_F(CachingAllocatorTest, EmptyCacheReturnsEverythingWhenNothingIsAllocated) {
  CudaCachingAllocator alloc(Device::cuda(0));
  std::vector<std::pair<void*, size_t>> blocks;
  for (size_t bytes : {size_t{1}, size_t{4096}, kMiB, 5 * kMiB, 64 * kMiB}) {
    blocks.emplace_back(alloc.allocate(bytes), bytes);
  }
  for (auto& [ptr, bytes] : blocks) alloc.deallocate(ptr, bytes);
  EXPECT_GT(alloc.stats().reservedBytes, 0u);
  alloc.emptyCache();
  AllocatorStats s = alloc.stats();
  EXPECT_EQ(s.allocatedBytes, 0u);
  EXPECT_EQ(s.reservedBytes, 0u);
  // And it still works afterwards.
  void* p = alloc.allocate(100);
  EXPECT_NE(p, nullptr);
  alloc.deallocate(p, 100);
}

TEST_F(CachingAllocatorTest, AbsurdRequestThrowsOutOfMemoryAndLeavesAllocatorUsable) {
  CudaCachingAllocator alloc(Device::cuda(0));
  void* keep = alloc.allocate(kMiB);
  const size_t absurd = size_t{1} << 50;  // 1 PiB
  try {
    alloc.allocate(absurd);
    FAIL() << "allocating 1 PiB succeeded";
  } catch (const OutOfMemory& e) {
    std::string what = e.what();
    EXPECT_NE(what.find(std::to_string(absurd)), std::string::npos) << what;
    EXPECT_NE(what.find("cuda:0"), std::string::npos) << what;
    EXPECT_NE(what.find("allocated"), std::string::npos) << what;
    EXPECT_NE(what.find("reserved"), std::string::npos) << what;
    EXPECT_EQ(e.code(), ExitCode::kOutOfMemory);
  }
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);  // the failure was not left behind
  EXPECT_EQ(alloc.stats().allocatedBytes, kMiB);
  EXPECT_THROW(alloc.allocate(~size_t{0}), OutOfMemory);  // rounding would wrap around
  void* p = alloc.allocate(kMiB);
  EXPECT_NE(p, nullptr);
  alloc.deallocate(p, kMiB);
  alloc.deallocate(keep, kMiB);
}

TEST_F(CachingAllocatorTest, ThreadsShareOneAllocator) {
  CudaCachingAllocator alloc(Device::cuda(0));
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&alloc, t] {
      for (int i = 0; i < 200; ++i) {
        size_t bytes = static_cast<size_t>(512 * (1 + (i + t) % 7));
        void* p = alloc.allocate(bytes);
        alloc.deallocate(p, bytes);
      }
    });
  }
  for (auto& th : threads) th.join();
  AllocatorStats s = alloc.stats();
  EXPECT_EQ(s.allocatedBytes, 0u);
  EXPECT_EQ(s.allocationCount, 800u);
  EXPECT_LE(s.systemAllocations, 4u * 7u);  // at most one block per thread per size class
}

// A graph replays the addresses it was captured with: a block handed out during a capture, or when
// it began, stays the graph's pool's once freed (another allocation gets a fresh block), and a capture that needs new
// memory gets it without invalidating the capture (cudaMalloc in relaxed mode); released, the pool's
// blocks serve everyone again.
TEST_F(CachingAllocatorTest, GraphPoolsKeepTheCapturedBlocksForTheGraph) {
  CudaCachingAllocator alloc(Device::cuda(0));
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  void* before = alloc.allocate(4096);
  alloc.deallocate(before, 4096);  // cached: a capture may take it
  void* held = alloc.allocate(8192);  // handed out when the capture begins: the graph may use it
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
  const uint64_t pool = alloc.beginGraphCapture();
  void* reused = alloc.allocate(4096);
  void* fresh = alloc.allocate(3 * kMiB);  // nothing cached fits: cudaMalloc during the capture
  ASSERT_EQ(cudaMemsetAsync(fresh, 0, 3 * kMiB, stream), cudaSuccess);
  alloc.deallocate(reused, 4096);
  void* again = alloc.allocate(4096);  // the pool's own freed block, within the capture
  alloc.endGraphCapture();
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);  // not invalidated by the cudaMalloc
  EXPECT_EQ(reused, before);
  EXPECT_EQ(again, reused);
  alloc.deallocate(again, 4096);
  alloc.deallocate(fresh, 3 * kMiB);
  alloc.deallocate(held, 8192);
  EXPECT_EQ(alloc.graphPoolBytes(), 4096u + 8192u + 4 * kMiB);
  void* outside = alloc.allocate(4096);
  EXPECT_NE(outside, again);  // the graph's block is not handed to others
  alloc.deallocate(outside, 4096);
  alloc.releaseGraphPool(pool);
  EXPECT_EQ(alloc.graphPoolBytes(), 0u);
  void* big = alloc.allocate(3 * kMiB);
  EXPECT_EQ(big, fresh);  // back in the common cache
  alloc.deallocate(big, 3 * kMiB);
  EXPECT_EQ(alloc.stats().allocatedBytes, 0u);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

// GpuContext's transient workspace (workspace.h) on the allocator: one block, grown only by a
// larger request; a block that a captured graph may use (handed out when the capture began) and that
// a later growth frees stays the graph's pool's, so nothing else gets it until the pool is released.
TEST_F(CachingAllocatorTest, WorkspaceGrowsOnceAndKeepsACapturedBlockForItsGraph) {
  CudaCachingAllocator alloc(Device::cuda(0));
  Workspace workspace(alloc);
  EXPECT_EQ(workspace.borrow(0), nullptr);
  void* first = workspace.borrow(4 * kMiB);
  EXPECT_EQ(workspace.borrow(3 * kMiB), first);
  EXPECT_EQ(workspace.borrow(4 * kMiB), first);
  EXPECT_EQ(workspace.growths(), 1u);
  EXPECT_EQ(alloc.stats().allocationCount, 1u);
  const uint64_t pool = alloc.beginGraphCapture();  // the graph records `first`
  alloc.endGraphCapture();
  void* grown = workspace.borrow(6 * kMiB);
  EXPECT_NE(grown, first);
  EXPECT_EQ(workspace.growths(), 2u);
  EXPECT_EQ(workspace.bytes(), 6 * kMiB);
  EXPECT_EQ(alloc.graphPoolBytes(), 4 * kMiB);
  void* other = alloc.allocate(4 * kMiB);
  EXPECT_NE(other, first) << "the graph's block went to another user";
  alloc.deallocate(other, 4 * kMiB);
  alloc.releaseGraphPool(pool);
  EXPECT_EQ(alloc.graphPoolBytes(), 0u);
  void* a = alloc.allocate(4 * kMiB);
  void* b = alloc.allocate(4 * kMiB);
  EXPECT_TRUE(a == first || b == first) << "the released pool's block serves everyone again";
  alloc.deallocate(a, 4 * kMiB);
  alloc.deallocate(b, 4 * kMiB);
}

TEST(PinnedHostAllocatorTest, AllocatesHostVisiblePinnedMemory) {
  COHORT_SKIP_WITHOUT_CUDA_DEVICE();
  PinnedHostAllocator pinned;
  EXPECT_TRUE(pinned.device().isCpu());
  EXPECT_EQ(pinned.allocate(0), nullptr);
  const size_t bytes = 3 * kMiB + 7;
  void* p = pinned.allocate(bytes);
  ASSERT_NE(p, nullptr);
  std::memset(p, 0x11, bytes);  // host-addressable
  cudaPointerAttributes attrs{};
  ASSERT_EQ(cudaPointerGetAttributes(&attrs, p), cudaSuccess);
  EXPECT_EQ(attrs.type, cudaMemoryTypeHost);
  AllocatorStats s = pinned.stats();
  EXPECT_EQ(s.allocatedBytes, bytes);
  EXPECT_EQ(s.peakAllocatedBytes, bytes);
  pinned.deallocate(p, bytes);
  EXPECT_EQ(pinned.stats().allocatedBytes, 0u);
}

}  // namespace
}  // namespace cohort::runtime::cuda

#else  // !COHORT_HAVE_CUDA

TEST(CachingAllocatorTest, NeedsCuda) { COHORT_SKIP_WITHOUT_CUDA_DEVICE(); }

#endif
