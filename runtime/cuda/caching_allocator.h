// CudaCachingAllocator: device memory for one CUDA device, with a cache of freed blocks and
// statistics, so the training loop's steady state never calls cudaMalloc or cudaFree.
//
// Sizes are rounded up: requests up to kSmallLimit (1 MiB) to a multiple of 512 bytes, larger ones
// to a multiple of 2 MiB. deallocate() returns the block to a cache keyed by size (no cudaFree, no
// device sync); allocate() takes the best-fitting cached block (the smallest one at least as large
// as the rounded request, from the same small/large class, and less than twice its size so a small
// request never pins a huge block) and otherwise calls cudaMalloc. Blocks are never split or
// merged. When cudaMalloc fails, the cache is returned to the driver (emptyCache) and the call
// retried once; if it fails again, OutOfMemory names the request, the device and the
// allocated/reserved figures.
//
// Streams (single-stream contract): a freed block may be handed out again at once, without waiting
// for kernels that still use it. That is safe only when every user of this allocator enqueues its
// work on one stream (or otherwise orders frees before reuse with events), because then any reuse
// runs after the earlier work in stream order. Tracking per-block stream use (PyTorch's
// recordStream) is out of scope; a side stream (data copies, communication) must use its own
// allocator or keep its buffers alive until an event says that stream is done with them.
//
// CUDA graphs (train/step_graph.h; PyTorch's private pools): a graph replays the addresses it was
// captured with, so a block the graph used must not go to anyone else while the graph lives. Between
// beginGraphCapture() and endGraphCapture() every block handed out belongs to that capture's pool,
// and so does every block handed out when the capture begins (the graph may use it too); freed, such
// a block is cached for that pool's allocations only, until releaseGraphPool() (the graph destroyed)
// returns the pool's blocks to the common cache. During a capture cudaMalloc runs in
// CUDA's relaxed capture mode: it is no stream operation, and the block it makes stays the pool's.
// Blocks freed before the capture are taken as usual (stream order: the graph's work comes after).
//
// Statistics: allocatedBytes counts the rounded sizes of blocks handed out and not yet returned;
// reservedBytes counts everything obtained from cudaMalloc (handed out + cached).
// Ownership: the allocator owns all device memory it obtained and must outlive every tensor it
// handed a block to: destroying it while a block is still handed out is a broken invariant
// (COHORT_CHECK naming the device, the blocks and the bytes), since that tensor would later free
// into a destroyed object. So make the GpuContext (or train::Job) before the model and destroy it
// after. Copy is deleted.
// Thread safety: all methods may be called from several threads (one mutex).
// Only built when CUDA is compiled in (COHORT_HAVE_CUDA).
//
//   CudaCachingAllocator alloc(Device::cuda(0));
//   Tensor w = Tensor::empty(Shape{512, 784}, alloc);
//   AllocatorStats s = alloc.stats();   // s.reservedBytes, s.peakAllocatedBytes, ...
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <unordered_map>

#include "runtime/allocator.h"

namespace cohort::runtime::cuda {

class CudaCachingAllocator final : public Allocator {
 public:
  static constexpr size_t kSmallLimit = size_t{1} << 20;
  static constexpr size_t kSmallRounding = 512;
  static constexpr size_t kLargeRounding = size_t{2} << 20;

  // `device` must be a CUDA device (InvalidArgument otherwise). No memory is reserved up front.
  explicit CudaCachingAllocator(Device device);
  ~CudaCachingAllocator() override;
  CudaCachingAllocator(const CudaCachingAllocator&) = delete;
  CudaCachingAllocator& operator=(const CudaCachingAllocator&) = delete;

  // nullptr for 0 bytes; 256-byte aligned device memory otherwise (cudaMalloc's alignment).
  void* allocate(size_t bytes) override;
  // `ptr` must come from this allocator's allocate() with the same `bytes`. Caches the block.
  void deallocate(void* ptr, size_t bytes) override;
  Device device() const override { return device_; }
  AllocatorStats stats() const override;

  // Returns every cached (free) block to the driver with cudaFree. Blocks handed out are kept.
  // cudaFree synchronises the device, so call this outside the hot loop.
  void emptyCache();
  // Sets the peaks to the current allocated/reserved figures.
  void resetPeakStats();
  // The size a request of `bytes` occupies.
  static size_t roundSize(size_t bytes);

  // Graph pools (see the header comment). One capture at a time; its pool's id, never 0.
  uint64_t beginGraphCapture();
  void endGraphCapture();
  // The pool's blocks go back to the common cache; those still handed out on their free.
  void releaseGraphPool(uint64_t pool);
  // Cached blocks held for graph pools (part of reservedBytes).
  size_t graphPoolBytes() const;

 private:
  using FreeBlocks = std::multimap<size_t, void*>;  // size -> block, ordered for best fit

  struct Block {
    void* ptr = nullptr;
    size_t size = 0;
  };
  // The best-fitting cached block for a rounded request, removed from the cache; {} if none.
  Block takeCachedLocked(size_t rounded);
  // cudaMalloc with one retry after emptying the cache; throws OutOfMemory.
  void* mallocLocked(size_t rounded, size_t requested);
  // cudaFree of every cached block.
  void freeCachedLocked();
  // A block handed out during a capture: its pool's cached blocks first.
  Block takeForCaptureLocked(size_t rounded, size_t requested);
  FreeBlocks& commonPool(size_t size) { return size <= kSmallLimit ? smallFree_ : largeFree_; }

  struct GraphPool {
    FreeBlocks free;  // the pool's freed blocks, any size class
  };

  Device device_;
  mutable std::mutex mutex_;
  FreeBlocks smallFree_;
  FreeBlocks largeFree_;
  std::unordered_map<void*, size_t> active_;  // handed-out block -> rounded size
  std::map<uint64_t, GraphPool> graphPools_;
  std::unordered_map<void*, uint64_t> graphBlocks_;  // block -> its graph pool (handed out or cached there)
  uint64_t capturing_ = 0;                           // the pool of the capture under way; 0: none
  uint64_t lastPool_ = 0;
  AllocatorStats stats_;
};

}  // namespace cohort::runtime::cuda
