// DataLoader: this rank's shard of a Dataset in batches, gathered ahead by a background thread.
//
// Order of one epoch (a pure function of seed and epoch, so a resumed run reproduces it):
//   1. indices = 0..N-1, Fisher-Yates shuffled by Rng(mix(seed, epoch)) when `shuffle`;
//   2. sharded like PyTorch's DistributedSampler: without dropLast, indices are padded by repeating
//      from their beginning up to ceil(N/W)*W; with dropLast truncated to floor(N/W)*W; rank r
//      takes indices[r], indices[r + W], ...;
//   3. cut into batches of batchSize; the last one is smaller, or dropped with dropLast.
// With `augment` enabled, each gathered sample is randomly cropped and/or flipped (augment.h) by
// choices that are a pure function of (seed, epoch, sample index), so batches stay reproducible.
// Disabled (the default), samples are copied unchanged. Use it for training loaders only.
// startEpoch(e, k) starts epoch e at batch k (a resumed run continues mid-epoch); next() returns
// batches k, k+1, ... and then false.
//
// Prefetch: a worker thread gathers up to prefetchDepth() batches ahead into a ring of
// prefetchDepth() + 1 preallocated, 64-byte aligned slots; depth 0 gathers synchronously inside
// next(). In steady state nothing is allocated. The depth is the requested `prefetch` capped twice,
// because the slots are allocated up front and a huge request would otherwise allocate them all
// (--prefetch 100000000 took gigabytes): at batchesPerEpoch() (no epoch has more to gather), and
// at prefetchMemoryBytes of slots ahead of the consumer's, but never below 1 when prefetch > 0 (a
// batch larger than the budget still gets its one slot ahead). An exception in the worker is
// rethrown by next(); next() waits at most `timeoutSeconds` for a batch and then throws
// TimeoutError. Ownership: the Dataset must outlive the loader. A Batch views a slot owned by the
// loader and is valid until the following next() or startEpoch() call, or the loader's destruction.
// Thread safety: one thread drives a loader (startEpoch/next); the worker thread is internal.
// Destruction and startEpoch() stop and join the worker.
//
//   DataLoader loader(dataset, {.batchSize = 64, .seed = 7, .rank = r, .worldSize = w});
//   loader.startEpoch(epoch);
//   for (Batch b; loader.next(b);) step(b.inputs, b.targets);
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "runtime/data/augment.h"
#include "runtime/data/dataset.h"
#include "runtime/tensor.h"

namespace cohort::runtime::data {

// The default budget of prefetched batch memory (DataLoaderOptions::prefetchMemoryBytes): far more
// than a few batches of any model here need, small next to a machine's memory.
constexpr size_t kDefaultPrefetchMemoryBytes = size_t{256} << 20;  // 256 MiB

struct DataLoaderOptions {
  int64_t batchSize = 0;  // > 0
  bool shuffle = true;
  uint64_t seed = 0;
  int rank = 0;       // in [0, worldSize)
  int worldSize = 1;  // >= 1
  int prefetch = 2;   // batches gathered ahead (>= 0; 0 = synchronous), capped: prefetchDepth()
  size_t prefetchMemoryBytes = kDefaultPrefetchMemoryBytes;  // cap on the slots gathered ahead
  bool dropLast = false;
  double timeoutSeconds = 60;  // longest wait in next() for the worker (> 0)
  Augment augment = {};        // default: none; enabled needs samples of shape [C, H, W]
};

struct Batch {
  Tensor inputs;      // [size, ...sampleShape]
  Tensor targets;     // [size] or [size, T]
  int64_t index = 0;  // batch number within the epoch
  int64_t size = 0;   // samples in this batch
};

// This rank's sample indices for `epoch`, in order (steps 1 and 2 above). Throws InvalidArgument
// for invalid options.
std::vector<int64_t> shardIndices(int64_t datasetSize, const DataLoaderOptions& options,
                                  int64_t epoch);

class DataLoader {
 public:
  // Throws InvalidArgument for invalid options (including augmentation of samples that are not
  // [C, H, W]). Allocates the slots; starts no thread yet.
  DataLoader(const Dataset& dataset, const DataLoaderOptions& options);
  ~DataLoader();
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  // Stops any running epoch and starts `epoch` (>= 0) at batch firstBatch in
  // [0, batchesPerEpoch()].
  void startEpoch(int64_t epoch, int64_t firstBatch = 0);
  // The next batch of the epoch, or false when it is done. Requires startEpoch().
  bool next(Batch& batch);

  int64_t batchesPerEpoch() const { return batchesPerEpoch_; }
  int64_t samplesPerEpoch() const { return samplesPerEpoch_; }  // this rank, after dropLast
  // The batches the worker gathers ahead: options().prefetch capped (see "Prefetch" above).
  int64_t prefetchDepth() const { return prefetchDepth_; }
  int64_t epoch() const { return epoch_; }
  const DataLoaderOptions& options() const { return options_; }

 private:
  struct Slot {
    Tensor inputs;   // [batchSize, ...sampleShape]
    Tensor targets;  // [batchSize, ...targetShape]
    int64_t index = 0;
    int64_t size = 0;
  };

  void stopWorker();
  void workerLoop();
  void gather(int64_t batchIndex, Slot& slot) const;
  // Waits until sequence number `seq` is produced; throws the worker's error or TimeoutError.
  void waitForProduced(std::unique_lock<std::mutex>& lock, int64_t seq);

  const Dataset& dataset_;
  const DataLoaderOptions options_;
  Augmenter augmenter_;
  int64_t sampleElems_ = 0;
  int64_t targetElems_ = 0;
  int64_t samplesPerEpoch_ = 0;
  int64_t batchesPerEpoch_ = 0;
  int64_t prefetchDepth_ = 0;  // slots_.size() - 1

  std::vector<Slot> slots_;
  std::vector<int64_t> indices_;  // this rank's samples for the current epoch
  int64_t epoch_ = -1;
  int64_t firstBatch_ = 0;
  int64_t batchesToGo_ = 0;  // batches of this epoch from firstBatch_ on

  // Sequence numbers count batches since startEpoch: seq s is batch firstBatch_ + s in slot
  // s % slots_.size(). The consumer holds at most seq consumed_ - 1; the worker may fill seq s once
  // s < released_ + slots_.size().
  int64_t consumed_ = 0;  // consumer thread only
  std::mutex mutex_;
  std::condition_variable producedCv_;
  std::condition_variable releasedCv_;
  int64_t produced_ = 0;      // guarded by mutex_
  int64_t released_ = 0;      // guarded by mutex_
  bool stop_ = false;         // guarded by mutex_
  std::exception_ptr error_;  // guarded by mutex_
  std::thread worker_;
};

}  // namespace cohort::runtime::data
