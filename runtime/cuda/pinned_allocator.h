// PinnedHostAllocator: page-locked host memory (cudaHostAlloc) for asynchronous host<->device
// copies.
//
// Memory from it is host memory (device() is cpu) that the GPU can DMA from and to, so
// cudaMemcpyAsync on a Stream overlaps with compute. Pinning is slow and limited: allocate staging
// buffers once (e.g. the DataLoader's batch buffers), not per step. No caching.
// Ownership: the caller owns each block until deallocate(); the allocator must outlive its blocks.
// Thread safety: all methods may be called from several threads.
// Only built when CUDA is compiled in (COHORT_HAVE_CUDA).
//
//   PinnedHostAllocator pinned;
//   Tensor staging = Tensor::empty(Shape{256, 784}, pinned);
#pragma once

#include <mutex>

#include "runtime/allocator.h"

namespace cohort::runtime::cuda {

class PinnedHostAllocator final : public Allocator {
 public:
  PinnedHostAllocator() = default;
  PinnedHostAllocator(const PinnedHostAllocator&) = delete;
  PinnedHostAllocator& operator=(const PinnedHostAllocator&) = delete;

  // Throws OutOfMemory naming the size when the system cannot pin that much.
  void* allocate(size_t bytes) override;
  void deallocate(void* ptr, size_t bytes) override;
  Device device() const override { return Device::cpu(); }
  // reservedBytes == allocatedBytes (nothing is cached).
  AllocatorStats stats() const override;

 private:
  mutable std::mutex mutex_;
  AllocatorStats stats_;
};

}  // namespace cohort::runtime::cuda
