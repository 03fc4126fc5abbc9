// DeviceLoader: a DataLoader's batches on a GPU, copied ahead of the compute stream on a copy
// stream of their own, so the host-to-device copy of batch k+1 overlaps the step on batch k.
//
// Each of `depth` + 1 slots holds a pinned host staging buffer and a device buffer (inputs and
// targets, sized for a full batch), plus three events:
//   copied    recorded on the copy stream after the slot's host-to-device copy;
//   consumed  recorded on the compute stream when the consumer hands the slot back, i.e. at the next
//             call to next(), after everything it enqueued on the batch;
//   staged    the copy event again, waited on by the host before the staging buffer is rewritten.
// The copy stream waits for `consumed` before it overwrites the device buffer and the compute stream
// waits for `copied` before it reads it; the host waits for `staged` before it rewrites the pinned
// buffer. A buffer is therefore reused only after every reader is done with it, by construction —
// no reuse-before-use, whatever the relative speed of the streams. Waiting is on the device except
// the host's wait on a staging copy, which is bounded by `timeout`.
// Input wait: timing events around the compute stream's wait for `copied` measure how long the
// compute stream sat idle for input; inputWaitMs() sums what has completed (near zero once the copy
// keeps ahead).
// Ownership: borrows the host loader and the GpuContext (both must outlive it); a Batch it returns
// views a device slot and is valid until the following next() or startEpoch().
// Thread safety: one thread. Only built when CUDA is compiled in (COHORT_HAVE_CUDA).
//
//   DeviceLoader gpuBatches(loader, gpu);
//   gpuBatches.startEpoch(epoch);
//   for (Batch b; gpuBatches.next(b);) step(b.inputs, b.targets);   // device tensors
#pragma once

#include <chrono>
#include <vector>

#include "runtime/cuda/gpu_context.h"
#include "runtime/cuda/pinned_allocator.h"
#include "runtime/data/data_loader.h"
#include "runtime/stream.h"

namespace cohort::runtime::data {

struct DeviceLoaderOptions {
  int depth = 2;  // batches copied ahead of the one being computed on (>= 1)
  std::chrono::milliseconds timeout = kDefaultSyncTimeout;
};

class DeviceLoader {
 public:
  DeviceLoader(DataLoader& host, cuda::GpuContext& gpu, DeviceLoaderOptions options = {});
  ~DeviceLoader();
  DeviceLoader(const DeviceLoader&) = delete;
  DeviceLoader& operator=(const DeviceLoader&) = delete;

  void startEpoch(int64_t epoch, int64_t firstBatch = 0);
  // DataLoader::startEpochAfter on the host loader (an elastic resume).
  void startEpochAfter(int64_t epoch, int64_t samplesSeen);
  // The next batch, on the GPU, with the compute stream already ordered after its copy; false at
  // the end of the epoch.
  bool next(Batch& batch);

  // Milliseconds the compute stream waited for input, over the waits that have completed so far.
  double inputWaitMs();
  int64_t batchesPerEpoch() const { return host_.batchesPerEpoch(); }

 private:
  struct Slot {
    Tensor stagedInputs, stagedTargets;  // pinned host
    Tensor inputs, targets;              // device
    Event copied, consumed;
    Event waitStart{EventOptions{.enableTiming = true}};
    Event waitEnd{EventOptions{.enableTiming = true}};
    bool timingPending = false;
    int64_t index = 0, size = 0;
  };
  // Takes the host loader's next batch into the next free slot and enqueues its copy; false when the
  // epoch has no more batches.
  bool issueCopy();
  void harvestTiming(Slot& slot);
  void releaseCurrent();

  DataLoader& host_;
  cuda::GpuContext& gpu_;
  DeviceLoaderOptions options_;
  Stream copyStream_;
  cuda::PinnedHostAllocator pinned_;
  std::vector<Slot> slots_;
  int64_t issued_ = 0;    // copies enqueued this epoch
  int64_t returned_ = 0;  // batches handed to the consumer this epoch
  bool hostDone_ = false;
  bool holding_ = false;  // the consumer holds slot (returned_ - 1)
  double waitMs_ = 0;
};

}  // namespace cohort::runtime::data
