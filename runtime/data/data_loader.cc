#include "runtime/data/data_loader.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <numeric>

#include "runtime/error.h"
#include "runtime/random.h"

namespace cohort::runtime::data {
namespace {

void validate(const DataLoaderOptions& o) {
  if (o.batchSize <= 0 || o.batchSize > kMaxBatchSize) {
    COHORT_THROW(InvalidArgument) << "data loader: batch size must be 1.." << kMaxBatchSize << " (2^40), got " << o.batchSize;
  }
  if (o.worldSize < 1) {
    COHORT_THROW(InvalidArgument) << "data loader: world size must be >= 1, got " << o.worldSize;
  }
  if (o.rank < 0 || o.rank >= o.worldSize) {
    COHORT_THROW(InvalidArgument) << "data loader: rank " << o.rank << " is outside [0, "
                                  << o.worldSize << ")";
  }
  if (o.prefetch < 0) {
    COHORT_THROW(InvalidArgument) << "data loader: prefetch must be >= 0, got " << o.prefetch;
  }
  if (!(o.timeoutSeconds > 0)) {
    COHORT_THROW(InvalidArgument) << "data loader: timeout must be > 0 seconds, got "
                                  << o.timeoutSeconds;
  }
}

// Samples per rank before batching: DistributedSampler's num_samples.
int64_t shardSize(int64_t n, const DataLoaderOptions& o) {
  return o.dropLast ? n / o.worldSize : (n + o.worldSize - 1) / o.worldSize;
}

// [rows, ...rest]
Shape withLeading(int64_t rows, const Shape& rest) {
  Shape s;
  s.push(rows);
  for (int i = 0; i < rest.rank(); ++i) s.push(rest[i]);
  return s;
}

// options.prefetch capped at the epoch's batches and at the memory budget of slots ahead, but at
// least 1 slot ahead when any was asked for.
int64_t cappedPrefetch(const DataLoaderOptions& o, int64_t batchesPerEpoch, size_t slotBytes) {
  int64_t depth = std::min<int64_t>(o.prefetch, batchesPerEpoch);
  if (depth > 0 && slotBytes > 0) {
    size_t withinBudget = std::max<size_t>(o.prefetchMemoryBytes / slotBytes, 1);
    depth = static_cast<int64_t>(std::min(static_cast<size_t>(depth), withinBudget));
  }
  return depth;
}

}  // namespace

std::vector<int64_t> epochOrder(int64_t datasetSize, const DataLoaderOptions& options, int64_t epoch) {
  validate(options);
  if (datasetSize < 0) COHORT_THROW(InvalidArgument) << "data loader: dataset size " << datasetSize;
  if (epoch < 0) COHORT_THROW(InvalidArgument) << "data loader: epoch must be >= 0, got " << epoch;
  std::vector<int64_t> perm(static_cast<size_t>(datasetSize));
  std::iota(perm.begin(), perm.end(), int64_t{0});
  if (options.shuffle) {
    Rng rng(mix(options.seed, static_cast<uint64_t>(epoch)));
    for (int64_t i = datasetSize - 1; i > 0; --i) {
      auto j = static_cast<int64_t>(rng.below(static_cast<uint64_t>(i) + 1));
      std::swap(perm[static_cast<size_t>(i)], perm[static_cast<size_t>(j)]);
    }
  }
  return perm;
}

std::vector<int64_t> shardOfRest(const std::vector<int64_t>& order, const DataLoaderOptions& options,
                                 int64_t samplesSeen) {
  validate(options);
  const auto n = static_cast<int64_t>(order.size());
  if (samplesSeen < 0 || samplesSeen > n) {
    COHORT_THROW(InvalidArgument) << "data loader: " << samplesSeen << " samples seen is outside [0, " << n
                                  << "], the epoch's samples";
  }
  // Position p of the padded (or truncated) order is order[p % N]: padding repeats the order from
  // its beginning, as often as needed when the rest is shorter than W.
  int64_t perRank = shardSize(n - samplesSeen, options);
  std::vector<int64_t> shard(static_cast<size_t>(perRank));
  for (int64_t s = 0; s < perRank; ++s) {
    int64_t p = samplesSeen + options.rank + s * options.worldSize;
    shard[static_cast<size_t>(s)] = order[static_cast<size_t>(p % n)];
  }
  return shard;
}

std::vector<int64_t> shardIndices(int64_t datasetSize, const DataLoaderOptions& options,
                                  int64_t epoch) {
  return shardOfRest(epochOrder(datasetSize, options, epoch), options, 0);
}

KeyedOrder::KeyedOrder(int64_t n, uint64_t key, bool shuffle) : n_(n), key_(key), shuffle_(shuffle) {
  while (halfBits_ < 31 && (uint64_t{1} << (2 * halfBits_)) < static_cast<uint64_t>(n)) ++halfBits_;
}

uint64_t KeyedOrder::permute(uint64_t x) const {
  const uint64_t mask = (uint64_t{1} << halfBits_) - 1;
  uint64_t left = x >> halfBits_, right = x & mask;
  for (uint64_t round = 0; round < 4; ++round) {
    const uint64_t mixed = left ^ (mix(key_ + round, right) & mask);
    left = right;
    right = mixed;
  }
  return (left << halfBits_) | right;
}

int64_t KeyedOrder::at(int64_t position) const {
  COHORT_CHECK(position >= 0 && position < n_) << "position " << position << " of " << n_;
  if (!shuffle_) return position;
  auto x = static_cast<uint64_t>(position);
  do {
    x = permute(x);
  } while (x >= static_cast<uint64_t>(n_));
  return static_cast<int64_t>(x);
}

DataLoader::DataLoader(const Dataset& dataset, const DataLoaderOptions& options)
    : dataset_(dataset), options_(options) {
  validate(options_);
  try {
    augmenter_ = Augmenter(options_.augment, dataset_.sampleShape());
  } catch (const InvalidArgument& e) {
    COHORT_THROW(InvalidArgument) << "data loader (" << dataset_.name() << "): " << e.what();
  }
  sampleElems_ = dataset_.sampleShape().numel();
  targetElems_ = dataset_.targetShape().numel();
  int64_t shard = shardSize(dataset_.size(), options_);
  int64_t b = options_.batchSize;
  batchesPerEpoch_ = options_.dropLast ? shard / b : (shard + b - 1) / b;
  samplesPerEpoch_ = options_.dropLast ? batchesPerEpoch_ * b : shard;
  int64_t slotRows = std::min(b, shard);
  size_t slotBytes = static_cast<size_t>(slotRows * (sampleElems_ + targetElems_)) * sizeof(float);
  prefetchDepth_ = cappedPrefetch(options_, batchesPerEpoch_, slotBytes);
  slots_.resize(static_cast<size_t>(prefetchDepth_) + 1);
  for (Slot& slot : slots_) {
    slot.inputs = Tensor::empty(withLeading(slotRows, dataset_.sampleShape()), cpuAllocator());
    slot.targets = Tensor::empty(withLeading(slotRows, dataset_.targetShape()), cpuAllocator());
    slot.samples.reserve(static_cast<size_t>(b));
  }
}

DataLoader::~DataLoader() { stopWorker(); }

void DataLoader::stopWorker() {
  if (worker_.joinable()) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    releasedCv_.notify_all();
    worker_.join();
  }
  stop_ = false;
  error_ = nullptr;
  produced_ = 0;
  released_ = 0;
  consumed_ = 0;
}

void DataLoader::startEpoch(int64_t epoch, int64_t firstBatch) {
  if (firstBatch < 0 || firstBatch > batchesPerEpoch_) {
    COHORT_THROW(InvalidArgument) << "data loader: first batch " << firstBatch << " is outside [0, "
                                  << batchesPerEpoch_ << "] for " << dataset_.name();
  }
  if (dataset_.held()) {
    std::vector<int64_t> indices = shardIndices(dataset_.size(), options_, epoch);  // validates epoch
    indices.resize(static_cast<size_t>(samplesPerEpoch_));                          // dropLast
    begin(epoch, std::move(indices), samplesPerEpoch_, 0);
  } else {
    if (epoch < 0) COHORT_THROW(InvalidArgument) << "data loader: epoch must be >= 0, got " << epoch;
    begin(epoch, {}, samplesPerEpoch_, 0);
  }
  firstBatch_ = firstBatch;
  run();
}

void DataLoader::startEpochAfter(int64_t epoch, int64_t samplesSeen) {
  const int64_t n = dataset_.size(), b = options_.batchSize;
  std::vector<int64_t> indices;
  int64_t count = 0;
  if (dataset_.held()) {
    indices = shardOfRest(epochOrder(n, options_, epoch), options_, samplesSeen);  // validates both
    count = static_cast<int64_t>(indices.size());
  } else {
    if (epoch < 0) COHORT_THROW(InvalidArgument) << "data loader: epoch must be >= 0, got " << epoch;
    if (samplesSeen < 0 || samplesSeen > n) {
      COHORT_THROW(InvalidArgument) << "data loader: " << samplesSeen << " samples seen is outside [0, " << n
                                    << "], the epoch's samples";
    }
    count = shardSize(n - samplesSeen, options_);
  }
  if (options_.dropLast) count = count / b * b;
  indices.resize(dataset_.held() ? static_cast<size_t>(count) : 0);
  begin(epoch, std::move(indices), count, samplesSeen);
  run();
}

// The epoch's samples from position samplesSeen of its order; batches numbered as if every step
// before had been W full batches.
void DataLoader::begin(int64_t epoch, std::vector<int64_t> indices, int64_t count, int64_t samplesSeen) {
  stopWorker();
  const auto b = options_.batchSize;
  indices_ = std::move(indices);
  count_ = count;
  if (!dataset_.held()) order_ = KeyedOrder(dataset_.size(), mix(options_.seed, static_cast<uint64_t>(epoch)), options_.shuffle);
  epoch_ = epoch;
  startSample_ = samplesSeen;
  baseBatch_ = firstBatch_ = samplesSeen / (options_.worldSize * b);
  endBatch_ = baseBatch_ + (count + b - 1) / b;
}

int64_t DataLoader::sampleAt(int64_t i) const {
  if (dataset_.held()) return indices_[static_cast<size_t>(i)];
  // Position p of the padded order is order[p mod N], as shardOfRest takes it.
  return order_.at((startSample_ + options_.rank + i * options_.worldSize) % dataset_.size());
}

void DataLoader::run() {
  batchesToGo_ = endBatch_ - firstBatch_;
  if (prefetchDepth_ > 0 && batchesToGo_ > 0) worker_ = std::thread([this] { workerLoop(); });
}

int64_t DataLoader::samplesSeenAfter(int64_t batchIndex) const {
  COHORT_CHECK(epoch_ >= 0 && batchIndex >= baseBatch_ - 1 && batchIndex < endBatch_)
      << "batch " << batchIndex << " of an epoch of batches [" << baseBatch_ << ", " << endBatch_ << ")";
  const int64_t taken = std::min((batchIndex + 1 - baseBatch_) * options_.batchSize, count_);
  return startSample_ + taken * options_.worldSize;
}

void DataLoader::batchSamples(int64_t batchIndex, std::vector<int64_t>& out) const {
  COHORT_CHECK(epoch_ >= 0 && batchIndex >= baseBatch_ && batchIndex < endBatch_)
      << "batch " << batchIndex << " of an epoch of batches [" << baseBatch_ << ", " << endBatch_ << ")";
  const int64_t begin = (batchIndex - baseBatch_) * options_.batchSize;
  const int64_t size = std::min(options_.batchSize, count_ - begin);
  out.resize(static_cast<size_t>(size));
  for (int64_t s = 0; s < size; ++s) out[static_cast<size_t>(s)] = sampleAt(begin + s);
}

void DataLoader::gather(int64_t batchIndex, Slot& slot) const {
  batchSamples(batchIndex, slot.samples);
  const std::vector<int64_t>& samples = slot.samples;
  const auto size = static_cast<int64_t>(samples.size());
  float* xOut = slot.inputs.data();
  float* yOut = slot.targets.data();
  if (!dataset_.held()) {  // made on demand (token shards: windows, which Augmenter refuses)
    for (int64_t s = 0; s < size; ++s) {
      dataset_.read(samples[static_cast<size_t>(s)], xOut + s * sampleElems_, yOut + s * targetElems_);
    }
    slot.index = batchIndex;
    slot.size = size;
    return;
  }
  const float* x = dataset_.inputs().data();
  const float* y = dataset_.targets().data();
  size_t xBytes = static_cast<size_t>(sampleElems_) * sizeof(float);
  size_t yBytes = static_cast<size_t>(targetElems_) * sizeof(float);
  for (int64_t s = 0; s < size; ++s) {
    int64_t i = samples[static_cast<size_t>(s)];
    if (augmenter_.enabled()) {
      augmenter_.apply(augmenter_.draw(options_.seed, epoch_, i), x + i * sampleElems_,
                       xOut + s * sampleElems_);
    } else {
      std::memcpy(xOut + s * sampleElems_, x + i * sampleElems_, xBytes);
    }
    std::memcpy(yOut + s * targetElems_, y + i * targetElems_, yBytes);
  }
  slot.index = batchIndex;
  slot.size = size;
}

// The worker waits for a free slot without a deadline on purpose: a slow training step is not a
// fault, and stopWorker() wakes it. The consumer's waits are the ones bounded (next()).
void DataLoader::workerLoop() {
  const auto slotCount = static_cast<int64_t>(slots_.size());
  try {
    for (int64_t seq = 0; seq < batchesToGo_; ++seq) {
      {
        std::unique_lock<std::mutex> lock(mutex_);
        releasedCv_.wait(lock, [&] { return stop_ || seq < released_ + slotCount; });
        if (stop_) return;
      }
      gather(firstBatch_ + seq, slots_[static_cast<size_t>(seq % slotCount)]);
      {
        std::lock_guard<std::mutex> lock(mutex_);
        produced_ = seq + 1;
      }
      producedCv_.notify_one();
    }
  } catch (...) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      error_ = std::current_exception();
    }
    producedCv_.notify_one();
  }
}

void DataLoader::waitForProduced(std::unique_lock<std::mutex>& lock, int64_t seq) {
  auto timeout = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(options_.timeoutSeconds));
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (produced_ <= seq) {
    if (error_) std::rethrow_exception(error_);
    if (producedCv_.wait_until(lock, deadline) == std::cv_status::timeout && produced_ <= seq &&
        !error_) {
      COHORT_THROW(TimeoutError) << "data loader (" << dataset_.name() << ", rank " << options_.rank
                                 << "): batch " << firstBatch_ + seq << " of epoch " << epoch_
                                 << " not ready after " << options_.timeoutSeconds
                                 << " s; the prefetch thread is stuck";
    }
  }
}

bool DataLoader::next(Batch& batch) {
  COHORT_CHECK(epoch_ >= 0) << "DataLoader::next() called before startEpoch()";
  const auto slotCount = static_cast<int64_t>(slots_.size());
  Slot* slot = nullptr;
  if (prefetchDepth_ == 0) {
    if (consumed_ >= batchesToGo_) return false;
    slot = &slots_[0];
    gather(firstBatch_ + consumed_, *slot);
  } else {
    std::unique_lock<std::mutex> lock(mutex_);
    if (released_ < consumed_) {  // the batch handed out last time is no longer in use
      released_ = consumed_;
      releasedCv_.notify_one();
    }
    if (consumed_ >= batchesToGo_) return false;
    waitForProduced(lock, consumed_);
    slot = &slots_[static_cast<size_t>(consumed_ % slotCount)];
  }
  ++consumed_;
  batch.inputs = slot->inputs.withRows(slot->size);
  batch.targets = slot->targets.withRows(slot->size);
  batch.index = slot->index;
  batch.size = slot->size;
  return true;
}

}  // namespace cohort::runtime::data
