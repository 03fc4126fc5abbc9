// Workspace: one grow-only block of device memory that transient users on a GpuContext's compute
// stream borrow, so a buffer that lives only within one kernel sequence (the bf16 attention
// backward's dS, nn/attention.cc) is allocated once for all layers and steps, not at every call.
//
// borrow(bytes) returns at least `bytes` of device memory (256-byte aligned, the caching allocator's
// alignment). The pointer is valid for work enqueued on the compute stream until the next borrow()
// or the Workspace's end: a borrower must finish with it in stream order before anyone borrows again,
// which holds for kernels enqueued on the one compute stream one after another. A request larger than
// the block frees it and takes a block of the new size (grow-only: the block never shrinks), so the
// block settles at the largest request after the first step; growths() counts those allocations.
//
// CUDA graphs (train/step_graph.h, caching_allocator.h's graph pools): a captured step records the
// block's address, and the block stays with the Workspace while the graph is replayed. A block
// handed out when a capture begins belongs to that capture's pool, so if a later, larger request
// frees it, the allocator caches it for that pool only and nothing else can take it while the graph
// lives; a block grown during a capture is the pool's own. The step graph captures only after an
// eager step of the same shapes, so the block has its size by then and a capture does not grow it.
// Ownership: the block comes from and goes back to `allocator`, which must outlive the Workspace
// (GpuContext declares it after its allocator). Copy is deleted.
// Thread safety: none; the training thread that owns the GpuContext uses it.
//
//   void* ds = gpu.workspace().borrow(attentionBackwardScratchBytes(shape, type));
//   attentionBackward({..., .scratch = ds, ...}, shape, gpu.stream());
#pragma once

#include <cstddef>
#include <cstdint>

#include "runtime/allocator.h"

namespace cohort::runtime::cuda {

class Workspace {
 public:
  explicit Workspace(Allocator& allocator) : allocator_(allocator) {}
  ~Workspace();
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;

  // nullptr for 0 bytes while nothing was borrowed; otherwise the block, grown to `bytes` if smaller.
  void* borrow(size_t bytes);
  size_t bytes() const { return bytes_; }
  // Blocks allocated so far (the first and each growth).
  uint64_t growths() const { return growths_; }

 private:
  Allocator& allocator_;
  void* block_ = nullptr;
  size_t bytes_ = 0;
  uint64_t growths_ = 0;
};

}  // namespace cohort::runtime::cuda
