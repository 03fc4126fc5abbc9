// The default Communicator::allocateBuffer(): ordinary, zero-filled, 64-byte aligned memory.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>

#include "collectives/communicator.h"

namespace cohort::collectives {

namespace {

class HeapBuffer : public Buffer {
 public:
  explicit HeapBuffer(size_t count) : Buffer(allocate(count), count) {}
  ~HeapBuffer() override { std::free(data()); }

 private:
  static float* allocate(size_t count) {
    const size_t bytes = std::max<size_t>(64, (count * sizeof(float) + 63) / 64 * 64);
    void* p = std::aligned_alloc(64, bytes);
    if (p == nullptr) throw std::bad_alloc();
    std::memset(p, 0, bytes);
    return static_cast<float*>(p);
  }
};

}  // namespace

BufferPtr Communicator::allocateBuffer(size_t count) { return std::make_unique<HeapBuffer>(count); }

}  // namespace cohort::collectives
