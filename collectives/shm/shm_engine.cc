#include "collectives/shm/shm_engine.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "collectives/shm/reduce_kernels.h"
#include "ipc/barrier.h"
#include "ipc/process_liveness.h"
#include "runtime/error.h"

namespace cohort::collectives::shm {

namespace {

constexpr size_t kAlignElems = 16;  // 64 bytes of float32

uint64_t packFingerprint(const Fingerprint& fp) {
  return static_cast<uint64_t>(fp.kind) | static_cast<uint64_t>(fp.op) << 8 | static_cast<uint64_t>(fp.dtype) << 16 |
         static_cast<uint64_t>(static_cast<uint32_t>(fp.root)) << 32;
}

Fingerprint unpackFingerprint(uint64_t sequence, uint64_t word, uint64_t count) {
  Fingerprint fp;
  fp.sequence = sequence;
  fp.kind = static_cast<CollectiveKind>(word & 0xff);
  fp.op = static_cast<ReduceOp>((word >> 8) & 0xff);
  fp.dtype = static_cast<runtime::DType>((word >> 16) & 0xff);
  fp.root = static_cast<int32_t>(static_cast<uint32_t>(word >> 32));
  fp.count = count;
  return fp;
}

// fpState encoding: 2*seq + 1 while rank writes fingerprint `seq`, 2*(seq + 1) once published.
uint64_t publishedState(uint64_t sequence) { return 2 * (sequence + 1); }

}  // namespace

ShmEngine::ShmEngine(const Options& options)
    : rank_(options.world.localRank),
      numRanks_(options.world.localWorldSize),
      timeout_(options.timeout),
      streamingBytes_(options.streamingBytes) {
  if (options.world.spansNodes()) {
    COHORT_THROW(InvalidArgument) << "the shm backend works on one node, but this job has " << options.world.worldSize
                                  << " ranks with " << options.world.localWorldSize << " on this node";
  }
  if (numRanks_ > kMaxSources) {
    COHORT_THROW(InvalidArgument) << "the shm backend serves at most " << kMaxSources << " local ranks, not "
                                  << numRanks_;
  }
  const size_t unit = kAlignElems * static_cast<size_t>(numRanks_);
  chunkElems_ = std::max(unit, options.chunkBytes / sizeof(float) / unit * unit);
  segElems_ = chunkElems_ / static_cast<size_t>(numRanks_);
  if (numRanks_ > 1) setUp(options);
}

void ShmEngine::setUp(const Options& options) {
  const size_t chunkBytes = chunkElems_ * sizeof(float);
  const SegmentLayout layout(numRanks_, chunkBytes);
  const auto generation = static_cast<uint64_t>(options.world.restartCount);
  if (rank_ == 0) {
    region_.emplace(ipc::ShmRegion::create({.jobId = options.world.jobId,
                                            .name = options.scope + "comm",
                                            .payloadBytes = layout.totalBytes,
                                            .generation = generation}));
    char* base = static_cast<char*>(region_->payload());
    auto* control = new (base) ShmControl{};
    control->numRanks = static_cast<uint32_t>(numRanks_);
    control->slots = kSlots;
    control->chunkBytes = chunkBytes;
    control->magic = kCommMagic;
    ipc::ProcessBarrier::initialize(base + layout.barrierOffset, ipc::ProcessBarrier::bytesFor(numRanks_), numRanks_);
    for (int q = 0; q < numRanks_; ++q) new (base + layout.slotsOffset + q * sizeof(RankSlot)) RankSlot{};
    region_->publish();
  } else {
    region_.emplace(ipc::ShmRegion::open({.jobId = options.world.jobId,
                                          .name = options.scope + "comm",
                                          .payloadBytes = layout.totalBytes,
                                          .generation = generation,
                                          .timeout = options.timeout}));
  }
  char* base = static_cast<char*>(region_->payload());
  const auto* control = reinterpret_cast<const ShmControl*>(base);
  if (control->magic != kCommMagic || control->numRanks != static_cast<uint32_t>(numRanks_) ||
      control->chunkBytes != chunkBytes || control->slots != static_cast<uint32_t>(kSlots)) {
    COHORT_THROW(InvalidArgument) << "shared-memory segment " << region_->name() << " was laid out for "
                                  << control->numRanks << " ranks and " << control->chunkBytes
                                  << "-byte chunks, but this rank expects " << numRanks_ << " and " << chunkBytes
                                  << " (do all ranks see the same COHORT_SHM_CHUNK_BYTES?)";
  }
  slots_ = reinterpret_cast<RankSlot*>(base + layout.slotsOffset);
  staging_ = base + layout.stagingOffset;
  RankSlot& mine = slots_[rank_];
  mine.startTicks.store(ipc::processStartTicks(getpid()).value_or(0), std::memory_order_relaxed);
  mine.pid.store(static_cast<uint64_t>(getpid()), std::memory_order_release);
  ipc::ProcessBarrier barrier(base + layout.barrierOffset, ipc::ProcessBarrier::bytesFor(numRanks_));
  barrier.arriveAndWait(rank_, {.what = "shm communicator set-up", .timeout = options.timeout});
  // Every rank has the segment mapped: its name is no longer needed, and removing it now means a
  // crash later leaves nothing behind.
  if (rank_ == 0) region_->unlink();
  waiter_.emplace(slots_, numRanks_, rank_);
  peerBuffers_.emplace(options.world.jobId, options.scope, generation, options.timeout);
  published_.resize(numRanks_);
  peerInputs_.resize(numRanks_);
  peerOutputs_.resize(numRanks_);
}

namespace {
// The one-shot all-reduce stages the whole input in one slot, so it must fit there.
bool isSmallAllReduce(const Fingerprint& fp, size_t slotBytes) {
  return fp.kind == CollectiveKind::kAllReduce &&
         fp.count * runtime::sizeOf(fp.dtype) <= std::min(kSmallBytes, slotBytes);
}
}  // namespace

ShmEngine::DirectBytes ShmEngine::directBytes(const Fingerprint& fp) const {
  const size_t bytes = fp.count * runtime::sizeOf(fp.dtype);
  const size_t whole = bytes * static_cast<size_t>(numRanks_);
  if (numRanks_ == 1 || bytes == 0) return {};
  switch (fp.kind) {
    case CollectiveKind::kAllReduce:
      return isSmallAllReduce(fp, chunkElems_ * sizeof(float)) ? DirectBytes{} : DirectBytes{bytes, bytes};
    case CollectiveKind::kReduceScatter:
      return {whole, bytes};
    case CollectiveKind::kAllGather:
      return {bytes, whole};
    default:
      return {};
  }
}

void ShmEngine::run(const CollectiveArgs& args) {
  if (numRanks_ == 1) return runSingleRank(args);
  const Fingerprint& fp = args.fingerprint;
  dtype_ = fp.dtype;
  waiter_->begin(fp, timeout_);
  if (isSmallAllReduce(fp, chunkElems_ * sizeof(float))) return allReduceSmall(args);
  const Sharing shared = exchangeFingerprints(args);
  switch (fp.kind) {
    case CollectiveKind::kBarrier:
      return;
    case CollectiveKind::kBroadcast:
      return broadcast(args);
    case CollectiveKind::kAllReduce:
      return shared.inputs && shared.outputs ? allReduceDirect(args) : pipeline(args);
    case CollectiveKind::kReduceScatter:
      return shared.inputs ? reduceScatterDirect(args) : pipeline(args);
    case CollectiveKind::kAllGather:
      return shared.inputs ? allGatherDirect(args) : pipeline(args);
  }
}

// One rank: a copy, or nothing in place (NCCL's in-place layout is input == output at rank 0).
void ShmEngine::runSingleRank(const CollectiveArgs& args) const {
  const Fingerprint& fp = args.fingerprint;
  if (fp.kind == CollectiveKind::kBarrier || fp.kind == CollectiveKind::kBroadcast) return;
  if (args.output != args.input && fp.count > 0)
    std::memmove(args.output, args.input, fp.count * runtime::sizeOf(fp.dtype));
}

// --- fingerprints -------------------------------------------------------------------------------

namespace {
void storeRef(std::atomic<uint64_t>& id, std::atomic<uint64_t>& offset, std::atomic<uint64_t>& bytes,
              const BufferRef& ref) {
  id.store(ref.id, std::memory_order_relaxed);
  offset.store(ref.offset, std::memory_order_relaxed);
  bytes.store(ref.bufferBytes, std::memory_order_relaxed);
}
BufferRef loadRef(const std::atomic<uint64_t>& id, const std::atomic<uint64_t>& offset,
                  const std::atomic<uint64_t>& bytes) {
  return {.id = id.load(std::memory_order_relaxed),
          .offset = offset.load(std::memory_order_relaxed),
          .bufferBytes = bytes.load(std::memory_order_relaxed)};
}
}  // namespace

ShmEngine::Sharing ShmEngine::exchangeFingerprints(const CollectiveArgs& args) {
  const Fingerprint& fp = args.fingerprint;
  RankSlot& mine = slots_[rank_];
  mine.fpState.store(2 * fp.sequence + 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  mine.fpWord.store(packFingerprint(fp), std::memory_order_relaxed);
  mine.fpCount.store(fp.count, std::memory_order_relaxed);
  storeRef(mine.inId, mine.inOffset, mine.inBytes, args.inputRef);
  storeRef(mine.outId, mine.outOffset, mine.outBytes, args.outputRef);
  mine.fpState.store(publishedState(fp.sequence), std::memory_order_release);
  Waiter::ring(mine);
  const uint64_t target = publishedState(fp.sequence);
  waiter_->waitAll(
      [&](int q) {
        uint64_t state = slots_[q].fpState.load(std::memory_order_acquire);
        return state >= target;
      },
      "issue it");
  // Every rank has published #sequence. A rank that already moved past it saw all fingerprints equal
  // to its own, so all matched; otherwise nobody moves on and every rank reads the same values.
  Sharing shared;
  for (int q = 0; q < numRanks_; ++q) {
    bool passed = false;
    if (!readPublished(q, fp.sequence, published_[q], passed) || passed) {
      // Only a collective that needs no later step of this rank can be passed: a barrier, a
      // broadcast's root, a small all-reduce. A direct collective reads the refs of every rank.
      COHORT_CHECK(directBytes(fp).input == 0)
          << "rank " << q << " moved past " << fp.str() << " before this rank read it";
      return {false, false};
    }
    shared.inputs = shared.inputs && published_[q].input.shared();
    shared.outputs = shared.outputs && published_[q].output.shared();
  }
  for (int q = 1; q < numRanks_; ++q) {
    if (!(published_[q].fingerprint == published_[0].fingerprint)) {
      COHORT_THROW(InvalidArgument) << "collective mismatch: rank 0 issued " << published_[0].fingerprint.str()
                                    << " but rank " << q << " issued " << published_[q].fingerprint.str();
    }
  }
  return shared;
}

// Reads what rank q published for `sequence`; `passed` when q already published a later one.
bool ShmEngine::readPublished(int q, uint64_t sequence, Published& published, bool& passed) const {
  const RankSlot& s = slots_[q];
  const uint64_t target = publishedState(sequence);
  uint64_t before = s.fpState.load(std::memory_order_acquire);
  if (before != target) {
    passed = before > target;
    return before > target;
  }
  uint64_t word = s.fpWord.load(std::memory_order_relaxed);
  uint64_t count = s.fpCount.load(std::memory_order_relaxed);
  published.input = loadRef(s.inId, s.inOffset, s.inBytes);
  published.output = loadRef(s.outId, s.outOffset, s.outBytes);
  std::atomic_thread_fence(std::memory_order_acquire);
  uint64_t after = s.fpState.load(std::memory_order_relaxed);
  passed = after != before;
  published.fingerprint = unpackFingerprint(sequence, word, count);
  return true;
}

// --- data movement ------------------------------------------------------------------------------

// A slot's segments keep their fp32 size whatever the element type (bf16 uses half of each).
char* ShmEngine::stage(int owner, uint64_t g, int segmentIndex) const {
  const size_t slot = static_cast<size_t>(g % kSlots);
  const size_t chunkBytes = chunkElems_ * sizeof(float);
  char* buffer = staging_ + (static_cast<size_t>(owner) * kSlots + slot) * chunkBytes;
  return buffer + static_cast<size_t>(segmentIndex) * segElems_ * sizeof(float);
}

void ShmEngine::publish(std::atomic<uint64_t>& counter, uint64_t value) {
  counter.store(value, std::memory_order_release);
  Waiter::ring(slots_[rank_]);
}

void ShmEngine::waitSlotFree(uint64_t g) {
  if (g < kSlots) return;
  const uint64_t need = g - kSlots + 1;
  waiter_->waitAll([&](int q) { return slots_[q].consumed.load(std::memory_order_acquire) >= need; },
                   "finish an earlier chunk");
}

// One round instead of two: the input goes into this rank's own slot first (no peer reads that slot
// before this rank publishes), and the fingerprint's release store publishes the data with it. The
// fingerprints are still compared before any peer's data is read or the output is written.
void ShmEngine::allReduceSmall(const CollectiveArgs& args) {
  const Fingerprint& fp = args.fingerprint;
  const uint64_t g = chunkBase_;
  waitSlotFree(g);
  std::memcpy(stage(rank_, g, 0), args.input, fp.count * elementBytes());
  exchangeFingerprints(args);
  const void* sources[kMaxSources];
  rankOrder(args.input, [&](int q) { return stage(q, g, 0); }, sources);
  reduceInto(fp.dtype, args.output, sources, numRanks_, fp.count, fp.op, 1.0f / static_cast<float>(numRanks_));
  RankSlot& mine = slots_[rank_];
  mine.copied.store(g + 1, std::memory_order_relaxed);
  mine.reduced.store(g + 1, std::memory_order_relaxed);
  publish(mine.consumed, g + 1);
  chunkBase_ += 1;
}

void ShmEngine::broadcast(const CollectiveArgs& args) {
  const Fingerprint& fp = args.fingerprint;
  const size_t chunks = (fp.count + chunkElems_ - 1) / chunkElems_;
  RankSlot& mine = slots_[rank_];
  const int root = fp.root;
  char* data = static_cast<char*>(args.output);
  for (size_t c = 0; c < chunks; ++c) {
    const uint64_t g = chunkBase_ + c;
    const size_t at = c * chunkElems_ * elementBytes();
    const size_t bytes = std::min(chunkElems_, fp.count - c * chunkElems_) * elementBytes();
    if (rank_ == root) {
      waitSlotFree(g);
      std::memcpy(stage(root, g, 0), data + at, bytes);
      publish(mine.copied, g + 1);
    } else {
      // Only the root matters here (the timeout message lists the ranks this predicate rejects).
      waiter_->waitRank(
          root, [&](int q) { return q != root || slots_[q].copied.load(std::memory_order_acquire) >= g + 1; },
          "stage the broadcast data");
      std::memcpy(data + at, stage(root, g, 0), bytes);
    }
    publish(mine.consumed, g + 1);
  }
  chunkBase_ += chunks;
}

}  // namespace cohort::collectives::shm
