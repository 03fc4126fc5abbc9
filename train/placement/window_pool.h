// WindowPool: the buffers that hold a parameter unit while ZeRO 2 and 3 need it whole (its gradient
// from its backward to its reduce-scatter; at stage 3 its gathered parameters around its forward and
// backward; train/placement/shard_sync.h). A window handed back is kept for the next unit that fits
// (the smallest free one that does), so a step's windows come from the same few allocations step
// after step instead of the allocator: the pool holds at most the windows in flight at the busiest
// moment of a step (e.g. the GPT's embeddings, one block computing and one block's collective).
// Windows live in the pool's ShardMemory (host memory, or a GPU's caching allocator) and are zeroed
// when taken unless the caller fills them whole (on a GPU: a fill enqueued on the compute stream, so ordered after whatever the stream
// was told to wait for before the take; shard_sync.h says what that is).
// Ownership: owns its buffers; a window is valid until the pool is destroyed. Borrows the memory.
// Thread safety: one thread (the training thread).
#pragma once

#include <cstddef>
#include <vector>

#include "runtime/tensor.h"
#include "train/placement/shard_memory.h"

namespace cohort::train {

class WindowPool {
 public:
  explicit WindowPool(const ShardMemory& memory) : memory_(memory) {}

  // A window of at least `floats` floats (64-byte aligned): zeroed (a gradient's, which the layers
  // may leave partly unwritten and whose padding the reduce-scatter reads), or as it is (one that a
  // collective is about to fill whole: an all-gather's output).
  enum class Fill { kZeroed, kAsItIs };
  float* take(size_t floats, Fill fill = Fill::kZeroed);
  // Hands a window back (nullptr: nothing); COHORT_CHECK that it is one of this pool's, in use.
  void give(float* window);
  size_t bytes() const;  // every buffer the pool holds, in use or not
  size_t windowsInUse() const;

 private:
  struct Block {
    runtime::Tensor data;
    size_t floats = 0;
    bool used = false;
  };
  const ShardMemory& memory_;
  std::vector<Block> blocks_;
};

}  // namespace cohort::train
