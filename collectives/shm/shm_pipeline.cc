// The chunked reduce-scatter / all-gather pipeline of ShmEngine (see shm_engine.h for the phases).
#include <algorithm>
#include <cstring>

#include "collectives/shm/reduce_kernels.h"
#include "collectives/shm/shm_engine.h"

namespace cohort::collectives::shm {

namespace {
constexpr size_t kAlignElems = 16;
size_t ceilDiv(size_t a, size_t b) { return (a + b - 1) / b; }
}  // namespace

size_t ShmEngine::numChunks(const Fingerprint& fp) const {
  if (fp.kind == CollectiveKind::kAllReduce) return ceilDiv(fp.count, chunkElems_);
  return ceilDiv(fp.count, segElems_);  // reduce-scatter / all-gather: pieces of each rank's block
}

// Where segment q of chunk `chunk` lives: `in` in the input, `out` in the output, `len` elements.
ShmEngine::Span ShmEngine::segment(const Fingerprint& fp, size_t chunk, int q) const {
  Span s;
  const auto qs = static_cast<size_t>(q);
  if (fp.kind == CollectiveKind::kAllReduce) {
    // A full chunk has segElems_ per rank; the last one is split evenly (64-byte aligned) instead.
    const size_t start = chunk * chunkElems_;
    const size_t rest = fp.count - start;
    const size_t seg = rest >= chunkElems_
                           ? segElems_
                           : ceilDiv(ceilDiv(rest, static_cast<size_t>(numRanks_)), kAlignElems) * kAlignElems;
    const size_t from = std::min(rest, qs * seg);
    s.len = std::min(seg, rest - from);
    s.in = s.out = start + from;
    return s;
  }
  const size_t piece = chunk * segElems_;
  s.len = std::min(segElems_, fp.count - piece);
  if (fp.kind == CollectiveKind::kReduceScatter) {
    s.in = qs * fp.count + piece;
    s.out = piece;
  } else {  // all-gather
    s.in = piece;
    s.out = qs * fp.count + piece;
  }
  return s;
}

// Output of a large collective bypasses the cache (see copyStreaming); a small one stays cached
// for the caller, which usually reads it next.
void ShmEngine::copyOut(float* out, const float* in, size_t len, size_t totalElems) const {
  if (totalElems * sizeof(float) >= streamingBytes_) {
    copyStreaming(out, in, len);
  } else {
    std::memcpy(out, in, len * sizeof(float));
  }
}

void ShmEngine::pipeline(const CollectiveArgs& args) {
  const Fingerprint& fp = args.fingerprint;
  const size_t chunks = numChunks(fp);
  const bool reduces = fp.kind != CollectiveKind::kAllGather;
  const bool gathers = fp.kind != CollectiveKind::kReduceScatter;
  // Step t: copyIn(t), reduce(t - 1), gather(t - 2). Each rank finishes every phase of chunk t - 3
  // before it waits for slot reuse at copyIn(t + 1), so with kSlots = 4 no wait can form a cycle.
  for (size_t t = 0; t < chunks + 2; ++t) {
    if (t < chunks) copyIn(args, t);
    if (reduces && t >= 1 && t - 1 < chunks) reduce(args, t - 1);
    if (gathers && t >= 2 && t - 2 < chunks) gather(args, t - 2);
  }
  chunkBase_ += chunks;
}

void ShmEngine::copyIn(const CollectiveArgs& args, size_t chunk) {
  const Fingerprint& fp = args.fingerprint;
  const uint64_t g = chunkBase_ + chunk;
  waitSlotFree(g);
  if (fp.kind == CollectiveKind::kAllGather) {
    Span s = segment(fp, chunk, rank_);
    std::memcpy(stage(rank_, g, rank_), args.input + s.in, s.len * sizeof(float));
  } else {
    // Only the peers' segments: this rank reduces its own segment straight from its input.
    for (int q = 0; q < numRanks_; ++q) {
      if (q == rank_) continue;
      Span s = segment(fp, chunk, q);
      std::memcpy(stage(rank_, g, q), args.input + s.in, s.len * sizeof(float));
    }
  }
  publish(slots_[rank_].copied, g + 1);
}

void ShmEngine::reduce(const CollectiveArgs& args, size_t chunk) {
  const Fingerprint& fp = args.fingerprint;
  const uint64_t g = chunkBase_ + chunk;
  waiter_->waitAll([&](int q) { return slots_[q].copied.load(std::memory_order_acquire) >= g + 1; },
                   "stage their input");
  const Span s = segment(fp, chunk, rank_);
  const float* sources[kMaxSources];
  sources[0] = args.input + s.in;
  for (int q = 0, k = 1; q < numRanks_; ++q) {
    if (q != rank_) sources[k++] = stage(q, g, rank_);
  }
  const float scale = 1.0f / static_cast<float>(numRanks_);
  RankSlot& mine = slots_[rank_];
  if (fp.kind == CollectiveKind::kAllReduce) {
    // Reduce into this rank's own slot (cached; the peers gather it from there), then copy it out.
    float* reducedSegment = stage(rank_, g, rank_);
    reduceInto(reducedSegment, sources, numRanks_, s.len, fp.op, scale);
    publish(mine.reduced, g + 1);
    copyOut(args.output + s.out, reducedSegment, s.len, fp.count);
  } else {
    reduceInto(args.output + s.out, sources, numRanks_, s.len, fp.op, scale);
    mine.reduced.store(g + 1, std::memory_order_relaxed);
    publish(mine.consumed, g + 1);  // reduce-scatter has no gather: this rank's reads are done
  }
}

void ShmEngine::gather(const CollectiveArgs& args, size_t chunk) {
  const Fingerprint& fp = args.fingerprint;
  const uint64_t g = chunkBase_ + chunk;
  const bool allGather = fp.kind == CollectiveKind::kAllGather;
  if (allGather) {
    waiter_->waitAll([&](int q) { return slots_[q].copied.load(std::memory_order_acquire) >= g + 1; },
                     "stage their input");
  } else {
    waiter_->waitAll([&](int q) { return slots_[q].reduced.load(std::memory_order_acquire) >= g + 1; },
                     "reduce their segment");
  }
  for (int q = 0; q < numRanks_; ++q) {
    // All-gather copies its own piece from its slot too: the output may alias the input.
    if (q == rank_ && !allGather) continue;
    Span s = segment(fp, chunk, q);
    copyOut(args.output + s.out, stage(q, g, q), s.len, fp.count * (allGather ? numRanks_ : 1));
  }
  publish(slots_[rank_].consumed, g + 1);
}

// --- direct all-reduce over shared buffers (see shm_engine.h) -----------------------------------

void ShmEngine::allReduceDirect(const CollectiveArgs& args) {
  const Fingerprint& fp = args.fingerprint;
  const size_t bytes = fp.count * sizeof(float);
  for (int q = 0; q < numRanks_; ++q) {
    if (q == rank_) continue;
    peerInputs_[q] = peerBuffers_->find(q, published_[q].input, bytes);
    peerOutputs_[q] = peerBuffers_->find(q, published_[q].output, bytes);
  }
  const size_t chunks = numChunks(fp);
  for (size_t t = 0; t <= chunks; ++t) {
    if (t < chunks) reduceDirect(args, t);
    if (t >= 1) gatherDirect(args, t - 1);
  }
  // The peers read this rank's input and output until their last gather.
  const uint64_t end = chunkBase_ + chunks;
  waiter_->waitAll([&](int q) { return slots_[q].consumed.load(std::memory_order_acquire) >= end; },
                   "finish reading this rank's buffers");
  chunkBase_ = end;
}

// In place is safe: segment r of a rank's input is read only by rank r before it publishes
// `reduced`, and that rank's gather overwrites it only after seeing that.
void ShmEngine::reduceDirect(const CollectiveArgs& args, size_t chunk) {
  const Fingerprint& fp = args.fingerprint;
  const uint64_t g = chunkBase_ + chunk;
  const Span s = segment(fp, chunk, rank_);
  const float* sources[kMaxSources];
  sources[0] = args.input + s.in;
  for (int q = 0, k = 1; q < numRanks_; ++q) {
    if (q != rank_) sources[k++] = peerInputs_[q] + s.in;
  }
  reduceInto(args.output + s.out, sources, numRanks_, s.len, fp.op, 1.0f / static_cast<float>(numRanks_));
  RankSlot& mine = slots_[rank_];
  mine.copied.store(g + 1, std::memory_order_relaxed);
  publish(mine.reduced, g + 1);
}

void ShmEngine::gatherDirect(const CollectiveArgs& args, size_t chunk) {
  const Fingerprint& fp = args.fingerprint;
  const uint64_t g = chunkBase_ + chunk;
  waiter_->waitAll([&](int q) { return slots_[q].reduced.load(std::memory_order_acquire) >= g + 1; },
                   "reduce their segment");
  for (int q = 0; q < numRanks_; ++q) {
    if (q == rank_) continue;
    const Span s = segment(fp, chunk, q);
    copyOut(args.output + s.out, peerOutputs_[q] + s.out, s.len, fp.count);
  }
  publish(slots_[rank_].consumed, g + 1);
}

}  // namespace cohort::collectives::shm
