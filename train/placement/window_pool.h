// WindowPool: the buffers that hold a parameter unit while ZeRO 2 and 3 need it whole (its gradient
// from its backward to its reduce-scatter; at stage 3 its gathered parameters around its forward and
// backward; train/placement/shard_sync.h). A window handed back is kept for the next unit that fits
// (the smallest free one that does), so a step's windows come from the same few allocations step
// after step instead of the allocator: the pool holds at most the windows in flight at the busiest
// moment of a step (e.g. the GPT's embeddings, one block computing and one block's collective).
// Windows are zeroed when taken.
// Ownership: owns its buffers; a window is valid until the pool is destroyed. Thread safety: one
// thread (the training thread).
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

namespace cohort::train {

class WindowPool {
 public:
  // A zeroed window of at least `floats` floats (64-byte aligned).
  float* take(size_t floats);
  // Hands a window back (nullptr: nothing); COHORT_CHECK that it is one of this pool's, in use.
  void give(float* window);
  size_t bytes() const;            // every buffer the pool holds, in use or not
  size_t windowsInUse() const;

 private:
  struct AlignedDelete {
    void operator()(float* p) const;
  };
  struct Block {
    std::unique_ptr<float, AlignedDelete> data;
    size_t floats = 0;
    bool used = false;
  };
  std::vector<Block> blocks_;
};

}  // namespace cohort::train
