// Allocator: the interface every memory source implements, and the CPU allocator.
//
// allocate() returns memory for `bytes` bytes (nullptr for 0 bytes) or throws OutOfMemory naming the
// size and device; deallocate() takes back exactly what allocate() returned with the same size.
// Implementations:
//   cpuAllocator()            64-byte aligned host memory (stateless; shared by everyone)
//   PinnedHostAllocator       page-locked host memory for async copies (CUDA builds)
//   CudaCachingAllocator      device memory with a size-class cache and statistics (CUDA builds)
// Thread safety: every implementation here is safe to call from several threads.
#pragma once

#include <cstddef>
#include <cstdint>

#include "runtime/device.h"

namespace cohort::runtime {

inline constexpr size_t kCpuAlignment = 64;

// Byte counters an allocator keeps. "allocated" is what callers hold now; "reserved" is what the
// allocator holds from the system (allocated + cached); peaks are high-water marks.
struct AllocatorStats {
  size_t allocatedBytes = 0;
  size_t reservedBytes = 0;
  size_t peakAllocatedBytes = 0;
  size_t peakReservedBytes = 0;
  uint64_t allocationCount = 0;  // calls to allocate() that returned memory
  uint64_t systemAllocations = 0;  // times the allocator went to the system (cache misses)
};

class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual void* allocate(size_t bytes) = 0;
  virtual void deallocate(void* ptr, size_t bytes) = 0;
  virtual Device device() const = 0;
  virtual AllocatorStats stats() const { return {}; }
};

// The process-wide CPU allocator. It holds no state, so sharing it is not a mutable global.
Allocator& cpuAllocator();

}  // namespace cohort::runtime
