// ShardMemory: where the buffers of sharded data parallel live (train/placement/shard_sync.h: the
// packed shards, the windows, the staging) and how they are filled, copied, scaled and packed into
// and out of the wire messages of bf16 gathers (runtime/wire.h; train/placement/gather_plan.h): host memory
// (cpuAllocator, memcpy and loops, done when the call returns) or one GPU (its caching allocator;
// cudaMemcpyAsync and the fill and scale kernels enqueued on its compute stream, the call returning
// at once). On a GPU every operation here is ordered by the compute stream alone, as the step's
// kernels are; a collective that reads or writes this memory is ordered against them by its
// communicator (nccl given the compute stream: it starts after the stream's work so far, and
// Work::waitOn makes the stream wait for it).
//
//   ShardMemory memory(job.gpu());                 // nullptr: the CPU
//   runtime::Tensor shard = memory.zeros(n);
//   memory.copy(shard.data(), flat + begin, count);
// Ownership: borrows the GpuContext, which must outlive it. Thread safety: the training thread.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "runtime/stream.h"
#include "runtime/tensor.h"
#include "runtime/wire.h"

namespace cohort::runtime::cuda {
class GpuContext;
}

namespace cohort::train {

class ShardMemory {
 public:
  explicit ShardMemory(runtime::cuda::GpuContext* gpu = nullptr) : gpu_(gpu) {}

  bool onGpu() const { return gpu_ != nullptr; }
  runtime::Device device() const;
  // The compute stream (GPU); nullptr on the CPU.
  const runtime::Stream* stream() const;
  // `floats` zeroed floats (GPU: zeroed on the stream), at least 64-byte aligned.
  runtime::Tensor zeros(size_t floats) const;
  // A view of `floats` floats at `data` in this memory.
  runtime::Tensor view(float* data, size_t floats) const;
  void copy(float* dst, const float* src, size_t floats) const;
  void zero(float* data, size_t floats) const;
  void scale(float* data, size_t floats, float alpha) const;  // nothing when alpha is 1
  // A copy of `table` in this memory (GPU: the copy enqueued on the stream, `table` staged before
  // the call returns), for packWire and unpackWire: segments() of the tensor returned.
  runtime::Tensor wireTable(const std::vector<runtime::WireSegment>& table) const;
  static const runtime::WireSegment* segments(const runtime::Tensor& wireTable) {
    return static_cast<const runtime::WireSegment*>(wireTable.raw());
  }
  // runtime/wire.h's packing and unpacking by `count` segments at `table` (in this memory):
  // runtime/cuda/wire_kernels.h's kernels on the stream, or the host's loops.
  void packWire(const float* dense, uint16_t* wire, const runtime::WireSegment* table, size_t count) const;
  void unpackWire(const uint16_t* wire, float* dense, const runtime::WireSegment* table, size_t count) const;
  // `floats` floats of this memory in a fresh CPU tensor (GPU: waits for the stream, at most `timeout`).
  runtime::Tensor toHost(const float* data, size_t floats, std::chrono::milliseconds timeout) const;
  // `floats` floats of this memory copied to `host` (host memory): on the CPU at once; on a GPU
  // enqueued on the compute stream after its work so far, done when the stream gets there (into
  // pinned memory the call returns at once; wait with an event recorded after it, or synchronize).
  void copyToHost(float* host, const float* data, size_t floats) const;
  // Waits until the compute stream's work so far is done (GPU, at most `timeout`); nothing on the CPU.
  void synchronize(std::chrono::milliseconds timeout) const;

 private:
  runtime::cuda::GpuContext* gpu_;
};

}  // namespace cohort::train
