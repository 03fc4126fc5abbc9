#include "runtime/cuda/caching_allocator.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <sstream>

#include "runtime/cuda/cuda_check.h"
#include "runtime/error.h"

namespace cohort::runtime::cuda {
namespace {

size_t roundUp(size_t bytes, size_t multiple) {
  return (bytes + multiple - 1) / multiple * multiple;
}

}  // namespace

CudaCachingAllocator::CudaCachingAllocator(Device device) : device_(device) {
  if (!device.isCuda()) {
    COHORT_THROW(InvalidArgument) << "CudaCachingAllocator needs a CUDA device, got "
                                  << device.str();
  }
}

CudaCachingAllocator::~CudaCachingAllocator() {
  std::lock_guard<std::mutex> lock(mutex_);
  // A block still handed out belongs to a tensor that will later call deallocate() on this
  // destroyed object: say so here, where the cause is, rather than crash there.
  if (!active_.empty()) {
    size_t bytes = 0;
    for (const auto& [ptr, size] : active_) bytes += size;
    COHORT_CHECK(active_.empty())
        << "the CUDA caching allocator of " << device_.str() << " is destroyed while " << active_.size()
        << " of its blocks (" << bytes << " bytes) are still handed out: a tensor outlives the allocator "
        << "(the GpuContext or train::Job) it came from; make the context first and destroy it last";
  }
  // A destructor must not throw: errors (e.g. a driver already shutting down) are ignored.
  int previous = -1;
  bool restore = cudaGetDevice(&previous) == cudaSuccess && previous != device_.index;
  if (restore) cudaSetDevice(device_.index);
  for (auto& [size, ptr] : smallFree_) cudaFree(ptr);
  for (auto& [size, ptr] : largeFree_) cudaFree(ptr);
  for (auto& [id, pool] : graphPools_) {
    for (auto& [size, ptr] : pool.free) cudaFree(ptr);
  }
  if (restore) cudaSetDevice(previous);
}

size_t CudaCachingAllocator::roundSize(size_t bytes) {
  if (bytes == 0) return 0;
  return bytes <= kSmallLimit ? roundUp(bytes, kSmallRounding) : roundUp(bytes, kLargeRounding);
}

void* CudaCachingAllocator::allocate(size_t bytes) {
  if (bytes == 0) return nullptr;
  size_t rounded = roundSize(bytes);
  if (rounded < bytes) {  // wrapped around: no device has that much memory
    COHORT_THROW(OutOfMemory) << "CUDA out of memory on " << device_.str() << ": request of "
                              << bytes << " bytes is too large";
  }
  std::lock_guard<std::mutex> lock(mutex_);
  Block block = capturing_ ? takeForCaptureLocked(rounded, bytes) : takeCachedLocked(rounded);
  if (!block.ptr) block = {mallocLocked(rounded, bytes), rounded};
  active_.emplace(block.ptr, block.size);
  stats_.allocatedBytes += block.size;
  stats_.peakAllocatedBytes = std::max(stats_.peakAllocatedBytes, stats_.allocatedBytes);
  ++stats_.allocationCount;
  return block.ptr;
}

CudaCachingAllocator::Block CudaCachingAllocator::takeCachedLocked(size_t rounded) {
  FreeBlocks& pool = rounded <= kSmallLimit ? smallFree_ : largeFree_;
  auto it = pool.lower_bound(rounded);
  if (it == pool.end() || it->first - rounded >= rounded) return {};
  Block block{it->second, it->first};
  pool.erase(it);
  return block;
}

CudaCachingAllocator::Block CudaCachingAllocator::takeForCaptureLocked(size_t rounded, size_t requested) {
  GraphPool& pool = graphPools_[capturing_];
  Block block;
  auto it = pool.free.lower_bound(rounded);
  if (it != pool.free.end() && it->first - rounded < rounded && (it->first <= kSmallLimit) == (rounded <= kSmallLimit)) {
    block = {it->second, it->first};
    pool.free.erase(it);
  } else {
    block = takeCachedLocked(rounded);
  }
  if (!block.ptr) {
    // Not a stream operation: allowed in a capture only in relaxed mode, which this thread takes for it.
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    COHORT_CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
    try {
      block = {mallocLocked(rounded, requested), rounded};
    } catch (...) {
      cudaThreadExchangeStreamCaptureMode(&mode);
      throw;
    }
    COHORT_CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
  }
  graphBlocks_[block.ptr] = capturing_;
  return block;
}

void* CudaCachingAllocator::mallocLocked(size_t rounded, size_t requested) {
  CudaDeviceGuard guard(device_.index);
  void* ptr = nullptr;
  cudaError_t status = cudaMalloc(&ptr, rounded);
  if (status == cudaErrorMemoryAllocation) {
    cudaGetLastError();  // clear it; the retry decides
    freeCachedLocked();
    status = cudaMalloc(&ptr, rounded);
  }
  if (status == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    size_t freeBytes = 0, totalBytes = 0;
    bool haveInfo = cudaMemGetInfo(&freeBytes, &totalBytes) == cudaSuccess;
    cudaGetLastError();
    std::ostringstream os;
    os << "CUDA out of memory on " << device_.str() << ": tried to allocate " << requested
       << " bytes (" << rounded << " rounded); this allocator has " << stats_.allocatedBytes
       << " bytes allocated and " << stats_.reservedBytes << " reserved";
    if (haveInfo) os << "; the device has " << freeBytes << " of " << totalBytes << " bytes free";
    throw OutOfMemory(os.str());
  }
  COHORT_CUDA_CHECK(status);
  stats_.reservedBytes += rounded;
  stats_.peakReservedBytes = std::max(stats_.peakReservedBytes, stats_.reservedBytes);
  ++stats_.systemAllocations;
  return ptr;
}

void CudaCachingAllocator::deallocate(void* ptr, size_t bytes) {
  if (!ptr) return;
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = active_.find(ptr);
  COHORT_CHECK(it != active_.end())
      << "deallocate of " << ptr << " (" << bytes
      << " bytes) that this allocator did not hand out on " << device_.str();
  size_t size = it->second;
  COHORT_CHECK(bytes <= size) << "deallocate of " << bytes << " bytes, block holds " << size;
  active_.erase(it);
  stats_.allocatedBytes -= size;
  auto graph = graphBlocks_.find(ptr);
  if (graph != graphBlocks_.end()) {
    graphPools_[graph->second].free.emplace(size, ptr);  // the graph's still: replays write it
    return;
  }
  commonPool(size).emplace(size, ptr);
}

uint64_t CudaCachingAllocator::beginGraphCapture() {
  std::lock_guard<std::mutex> lock(mutex_);
  COHORT_CHECK(capturing_ == 0) << "a graph capture began on " << device_.str() << " while pool " << capturing_
                                << " still captures";
  capturing_ = ++lastPool_;
  graphPools_[capturing_];
  // The graph may use any block handed out now (a module's activations, the inputs): freed later,
  // each stays the graph's too.
  for (const auto& [ptr, size] : active_) graphBlocks_.emplace(ptr, capturing_);
  return capturing_;
}

void CudaCachingAllocator::endGraphCapture() {
  std::lock_guard<std::mutex> lock(mutex_);
  capturing_ = 0;
}

void CudaCachingAllocator::releaseGraphPool(uint64_t pool) {
  std::lock_guard<std::mutex> lock(mutex_);
  COHORT_CHECK(pool != capturing_) << "graph pool " << pool << " released while it captures";
  auto it = graphPools_.find(pool);
  if (it == graphPools_.end()) return;
  for (auto& [size, ptr] : it->second.free) commonPool(size).emplace(size, ptr);
  graphPools_.erase(it);
  std::erase_if(graphBlocks_, [pool](const auto& entry) { return entry.second == pool; });
}

size_t CudaCachingAllocator::graphPoolBytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  size_t bytes = 0;
  for (const auto& [id, pool] : graphPools_) {
    for (const auto& [size, ptr] : pool.free) bytes += size;
  }
  return bytes;
}

void CudaCachingAllocator::freeCachedLocked() {
  CudaDeviceGuard guard(device_.index);
  for (FreeBlocks* pool : {&smallFree_, &largeFree_}) {
    for (auto& [size, ptr] : *pool) {
      COHORT_CUDA_CHECK(cudaFree(ptr));
      stats_.reservedBytes -= size;
    }
    pool->clear();
  }
}

void CudaCachingAllocator::emptyCache() {
  std::lock_guard<std::mutex> lock(mutex_);
  freeCachedLocked();
}

void CudaCachingAllocator::resetPeakStats() {
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.peakAllocatedBytes = stats_.allocatedBytes;
  stats_.peakReservedBytes = stats_.reservedBytes;
}

AllocatorStats CudaCachingAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

}  // namespace cohort::runtime::cuda
