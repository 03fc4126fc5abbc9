#include "train/placement/window_pool.h"

#include <algorithm>
#include <new>

#include "runtime/error.h"

namespace cohort::train {

namespace {
constexpr std::align_val_t kAlignment{64};
}

void WindowPool::AlignedDelete::operator()(float* p) const { ::operator delete[](p, kAlignment); }

float* WindowPool::take(size_t floats) {
  Block* best = nullptr;
  for (Block& b : blocks_) {
    if (!b.used && b.floats >= floats && (!best || b.floats < best->floats)) best = &b;
  }
  if (!best) {
    void* memory = ::operator new[](std::max<size_t>(floats, 1) * sizeof(float), kAlignment);
    blocks_.push_back({.data = std::unique_ptr<float, AlignedDelete>(static_cast<float*>(memory)), .floats = floats});
    best = &blocks_.back();
  }
  best->used = true;
  std::fill_n(best->data.get(), floats, 0.0f);
  return best->data.get();
}

void WindowPool::give(float* window) {
  if (!window) return;
  for (Block& b : blocks_) {
    if (b.data.get() != window) continue;
    COHORT_CHECK(b.used) << "a window handed back twice";
    b.used = false;
    return;
  }
  COHORT_CHECK(false) << "a window that is not the pool's";
}

size_t WindowPool::bytes() const {
  size_t floats = 0;
  for (const Block& b : blocks_) floats += b.floats;
  return floats * sizeof(float);
}

size_t WindowPool::windowsInUse() const {
  return static_cast<size_t>(std::count_if(blocks_.begin(), blocks_.end(), [](const Block& b) { return b.used; }));
}

}  // namespace cohort::train
