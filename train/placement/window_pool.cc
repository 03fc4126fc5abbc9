#include "train/placement/window_pool.h"

#include <algorithm>

#include "runtime/error.h"

namespace cohort::train {

float* WindowPool::take(size_t floats, Fill fill) {
  Block* best = nullptr;
  for (Block& b : blocks_) {
    if (!b.used && b.floats >= floats && (!best || b.floats < best->floats)) best = &b;
  }
  if (!best) {
    blocks_.push_back({.data = memory_.zeros(std::max<size_t>(floats, 1)), .floats = floats});
    best = &blocks_.back();
  } else if (fill == Fill::kZeroed) {
    memory_.zero(best->data.data(), floats);
  }
  best->used = true;
  return best->data.data();
}

void WindowPool::give(float* window) {
  if (!window) return;
  for (Block& b : blocks_) {
    if (b.data.data() != window) continue;
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
