// The transient device workspace of a GpuContext (runtime/cuda/workspace.h).
#include "runtime/cuda/workspace.h"

namespace cohort::runtime::cuda {

Workspace::~Workspace() {
  if (block_) allocator_.deallocate(block_, bytes_);
}

void* Workspace::borrow(size_t bytes) {
  if (bytes <= bytes_) return block_;
  // The old block's last users are enqueued on the compute stream before whatever the new block's
  // borrower enqueues, so it may go back first (the caching allocator's single-stream contract) and
  // the growth never holds both.
  if (block_) allocator_.deallocate(block_, bytes_);
  block_ = nullptr;
  bytes_ = 0;
  block_ = allocator_.allocate(bytes);  // may throw OutOfMemory: then nothing is held
  bytes_ = bytes;
  ++growths_;
  return block_;
}

}  // namespace cohort::runtime::cuda
