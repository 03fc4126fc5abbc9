#include "runtime/cuda/pinned_allocator.h"

#include <cuda_runtime.h>

#include <algorithm>

#include "runtime/cuda/cuda_check.h"
#include "runtime/error.h"

namespace cohort::runtime::cuda {

void* PinnedHostAllocator::allocate(size_t bytes) {
  if (bytes == 0) return nullptr;
  void* ptr = nullptr;
  cudaError_t status = cudaHostAlloc(&ptr, bytes, cudaHostAllocDefault);
  if (status == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    COHORT_THROW(OutOfMemory) << "out of pinned host memory allocating " << bytes << " bytes";
  }
  COHORT_CUDA_CHECK(status);
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.allocatedBytes += bytes;
  stats_.reservedBytes += bytes;
  stats_.peakAllocatedBytes = std::max(stats_.peakAllocatedBytes, stats_.allocatedBytes);
  stats_.peakReservedBytes = std::max(stats_.peakReservedBytes, stats_.reservedBytes);
  ++stats_.allocationCount;
  ++stats_.systemAllocations;
  return ptr;
}

void PinnedHostAllocator::deallocate(void* ptr, size_t bytes) {
  if (!ptr) return;
  COHORT_CUDA_CHECK(cudaFreeHost(ptr));
  std::lock_guard<std::mutex> lock(mutex_);
  COHORT_CHECK(stats_.allocatedBytes >= bytes)
      << "freeing " << bytes << " pinned bytes, " << stats_.allocatedBytes << " allocated";
  stats_.allocatedBytes -= bytes;
  stats_.reservedBytes -= bytes;
}

AllocatorStats PinnedHostAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

}  // namespace cohort::runtime::cuda
