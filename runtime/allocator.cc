#include "runtime/allocator.h"

#include <cstdlib>

#include "runtime/error.h"

namespace cohort::runtime {
namespace {

class CpuAllocator final : public Allocator {
 public:
  void* allocate(size_t bytes) override {
    if (bytes == 0) return nullptr;
    size_t rounded = (bytes + kCpuAlignment - 1) / kCpuAlignment * kCpuAlignment;
    void* p = std::aligned_alloc(kCpuAlignment, rounded);
    if (!p) COHORT_THROW(OutOfMemory) << "out of host memory allocating " << bytes << " bytes";
    return p;
  }
  void deallocate(void* ptr, size_t) override { std::free(ptr); }
  Device device() const override { return Device::cpu(); }
};

}  // namespace

Allocator& cpuAllocator() {
  static CpuAllocator allocator;
  return allocator;
}

}  // namespace cohort::runtime
