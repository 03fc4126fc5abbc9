// DataLoader: this rank's shard of a Dataset in batches, gathered ahead by a background thread.
//
// Order of one epoch (a pure function of seed and epoch, so a resumed run reproduces it):
//   1. the epoch order: 0..N-1, Fisher-Yates shuffled by Rng(mix(seed, epoch)) when `shuffle`; the
//      same for every rank and every world size W (epochOrder());
//   2. sharded like PyTorch's DistributedSampler: without dropLast, the order is padded by repeating
//      from its beginning up to ceil(N/W)*W (position p is order[p mod N]); with dropLast truncated
//      to floor(N/W)*W; rank r takes positions r, r + W, r + 2W, ...;
//   3. cut into batches of batchSize; the last one is smaller, or dropped with dropLast.
// Strided shards make the job's progress a prefix of the epoch order: once every rank has taken k
// full batches, the job has consumed exactly positions [0, k*W*batchSize), whatever W is. That is
// what an elastic resume needs (docs/checkpoints.md): startEpochAfter(e, S) continues an epoch of
// which a job of any world size has seen S positions, with steps 2 and 3 applied to the rest of the
// order, positions [S, N), as if it were a whole epoch of N - S samples (padding, or truncation with
// dropLast, happen only at its end). With S = k*W*batchSize it is startEpoch(e, k), batch for batch.
// With `augment` enabled, each gathered sample is randomly cropped and/or flipped (augment.h) by
// choices that are a pure function of (seed, epoch, sample index), so batches stay reproducible.
// Disabled (the default), samples are copied unchanged. Use it for training loaders only.
// A dataset that makes its samples on demand (Dataset::held() false: token shards) may hold far more
// samples than fit a table of them, so its epoch order in step 1 is KeyedOrder instead: a keyed
// permutation of 0..N-1 (key mix(seed, epoch); the identity without `shuffle`) computed per position,
// and the loader keeps no table of indices; steps 2 and 3 are the same.
// startEpoch(e, k) starts epoch e at batch k (a resumed run continues mid-epoch); next() returns
// batches k, k+1, ... and then false. After startEpochAfter(e, S) batches are numbered from
// firstBatch() = S / (W*batchSize) (rounded down) up to endBatch().
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

// The largest batch: every count the loader forms from it (batches, samples seen by W ranks) fits
// an int64_t, and a batch larger than the data set takes all of it anyway.
inline constexpr int64_t kMaxBatchSize = int64_t{1} << 40;

struct DataLoaderOptions {
  int64_t batchSize = 0;  // 1..kMaxBatchSize
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
  Tensor inputs = {};   // [size, ...sampleShape]
  Tensor targets = {};  // [size] or [size, T]
  int64_t index = 0;  // batch number within the epoch
  int64_t size = 0;   // samples in this batch
};

// The epoch order (step 1 above): a permutation of 0..datasetSize-1 that depends on the seed, the
// epoch and `shuffle` only. Throws InvalidArgument for invalid options.
std::vector<int64_t> epochOrder(int64_t datasetSize, const DataLoaderOptions& options, int64_t epoch);
// This rank's samples of positions [samplesSeen, N) of `order` (step 2 above applied to what is
// left of the epoch), with samplesSeen in [0, N].
std::vector<int64_t> shardOfRest(const std::vector<int64_t>& order, const DataLoaderOptions& options,
                                 int64_t samplesSeen);
// This rank's sample indices for `epoch`, in order (steps 1 and 2 above): shardOfRest(order, 0).
std::vector<int64_t> shardIndices(int64_t datasetSize, const DataLoaderOptions& options,
                                  int64_t epoch);

// A permutation of 0..n-1 computed per position, for orders too long to tabulate: a 4-round Feistel
// network keyed by `key` over the smallest power of 4 that holds n, walked along its cycle until the
// value falls below n (fewer than 4 steps in expectation). The identity when !shuffle. Cheap to copy.
class KeyedOrder {
 public:
  KeyedOrder() = default;
  KeyedOrder(int64_t n, uint64_t key, bool shuffle);
  int64_t at(int64_t position) const;  // position in [0, n)

 private:
  uint64_t permute(uint64_t x) const;
  int64_t n_ = 0;
  uint64_t key_ = 0;
  int halfBits_ = 0;
  bool shuffle_ = false;
};

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
  // Stops any running epoch and starts `epoch` after the job (of this or any other world size) has
  // consumed positions [0, samplesSeen) of its order, samplesSeen in [0, N]: this rank takes its
  // share of the rest (see "Order" above). Throws InvalidArgument outside that range.
  void startEpochAfter(int64_t epoch, int64_t samplesSeen);
  // The next batch of the epoch, or false when it is done. Requires startEpoch().
  bool next(Batch& batch);

  // The current epoch's batches are [firstBatch(), endBatch()): endBatch() is batchesPerEpoch()
  // unless the epoch was started by startEpochAfter() at a point that is not a whole step of W
  // full batches.
  int64_t firstBatch() const { return firstBatch_; }
  int64_t endBatch() const { return endBatch_; }
  // The positions of the epoch order the job has consumed once every rank has taken the current
  // epoch's batches up to and including `batchIndex` (padding counted): what startEpochAfter()
  // continues from. samplesSeenAfter(firstBatch() - 1) is where the epoch started.
  int64_t samplesSeenAfter(int64_t batchIndex) const;
  // The dataset indices of batch `batchIndex` of the current epoch, on this rank, into `out` (resized
  // to the batch: nothing is allocated once it has held a batch). Any thread.
  void batchSamples(int64_t batchIndex, std::vector<int64_t>& out) const;

  int64_t batchesPerEpoch() const { return batchesPerEpoch_; }
  int64_t samplesPerEpoch() const { return samplesPerEpoch_; }  // this rank, after dropLast
  // The batches the worker gathers ahead: options().prefetch capped (see "Prefetch" above).
  int64_t prefetchDepth() const { return prefetchDepth_; }
  int64_t epoch() const { return epoch_; }
  const DataLoaderOptions& options() const { return options_; }
  const Dataset& dataset() const { return dataset_; }

 private:
  struct Slot {
    Tensor inputs;   // [batchSize, ...sampleShape]
    Tensor targets;  // [batchSize, ...targetShape]
    std::vector<int64_t> samples;  // the batch's dataset indices
    int64_t index = 0;
    int64_t size = 0;
  };

  void stopWorker();
  void begin(int64_t epoch, std::vector<int64_t> indices, int64_t count, int64_t samplesSeen);
  int64_t sampleAt(int64_t i) const;  // this rank's i-th sample of the current epoch
  void run();  // starts the worker for batches [firstBatch_, endBatch_)
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
  // The current epoch: this rank's count_ samples from position startSample_ of the order on (cut
  // to whole batches with dropLast), the first opening batch baseBatch_: indices_, or for a dataset
  // made on demand order_ at positions startSample_ + rank + i·W (mod N).
  std::vector<int64_t> indices_;
  KeyedOrder order_;
  int64_t count_ = 0;
  int64_t epoch_ = -1;
  int64_t startSample_ = 0;
  int64_t baseBatch_ = 0;
  int64_t firstBatch_ = 0;
  int64_t endBatch_ = 0;
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
