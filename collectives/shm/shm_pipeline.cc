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
// for the caller, which usually reads it next. `len` and `totalElems` in elements.
void ShmEngine::copyOut(void* out, const void* in, size_t len, size_t totalElems) const {
  if (totalElems * elementBytes() >= streamingBytes_) {
    copyStreamingBytes(out, in, len * elementBytes());
  } else {
    std::memcpy(out, in, len * elementBytes());
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
  const size_t e = elementBytes();
  const auto* input = static_cast<const char*>(args.input);
  waitSlotFree(g);
  if (fp.kind == CollectiveKind::kAllGather) {
    Span s = segment(fp, chunk, rank_);
    std::memcpy(stage(rank_, g, rank_), input + s.in * e, s.len * e);
  } else {
    // Only the peers' segments: this rank reduces its own segment straight from its input.
    for (int q = 0; q < numRanks_; ++q) {
      if (q == rank_) continue;
      Span s = segment(fp, chunk, q);
      std::memcpy(stage(rank_, g, q), input + s.in * e, s.len * e);
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
  const size_t e = elementBytes();
  auto* output = static_cast<char*>(args.output);
  const void* sources[kMaxSources];
  rankOrder(static_cast<const char*>(args.input) + s.in * e, [&](int q) { return stage(q, g, rank_); }, sources);
  const float scale = 1.0f / static_cast<float>(numRanks_);
  RankSlot& mine = slots_[rank_];
  if (fp.kind == CollectiveKind::kAllReduce) {
    // Reduce into this rank's own slot (cached; the peers gather it from there), then copy it out.
    char* reducedSegment = stage(rank_, g, rank_);
    reduceInto(fp.dtype, reducedSegment, sources, numRanks_, s.len, fp.op, scale);
    publish(mine.reduced, g + 1);
    copyOut(output + s.out * e, reducedSegment, s.len, fp.count);
  } else {
    // In place (NCCL's layout) the output segment is this rank's source, which reduceInto allows.
    reduceInto(fp.dtype, output + s.out * e, sources, numRanks_, s.len, fp.op, scale);
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
  auto* output = static_cast<char*>(args.output);
  for (int q = 0; q < numRanks_; ++q) {
    // All-gather copies its own piece from its slot too (in place it lands where it already is).
    if (q == rank_ && !allGather) continue;
    Span s = segment(fp, chunk, q);
    copyOut(output + s.out * elementBytes(), stage(q, g, q), s.len, fp.count * (allGather ? numRanks_ : 1));
  }
  publish(slots_[rank_].consumed, g + 1);
}

// --- direct all-reduce over shared buffers (see shm_engine.h) -----------------------------------

// Maps every peer's input (and output) as published with the fingerprint.
void ShmEngine::mapPeers(const CollectiveArgs& args, bool outputs) {
  const DirectBytes bytes = directBytes(args.fingerprint);
  for (int q = 0; q < numRanks_; ++q) {
    if (q == rank_) continue;
    peerInputs_[q] = reinterpret_cast<const char*>(peerBuffers_->find(q, published_[q].input, bytes.input));
    if (outputs) peerOutputs_[q] = reinterpret_cast<const char*>(peerBuffers_->find(q, published_[q].output, bytes.output));
  }
}

// The peers read this rank's buffers until they publish `consumed` for its last chunk.
void ShmEngine::awaitPeersDone(uint64_t end) {
  waiter_->waitAll([&](int q) { return slots_[q].consumed.load(std::memory_order_acquire) >= end; },
                   "finish reading this rank's buffers");
  chunkBase_ = end;
}

void ShmEngine::allReduceDirect(const CollectiveArgs& args) {
  mapPeers(args, true);
  const size_t chunks = numChunks(args.fingerprint);
  for (size_t t = 0; t <= chunks; ++t) {
    if (t < chunks) reduceDirect(args, t);
    if (t >= 1) gatherDirect(args, t - 1);
  }
  awaitPeersDone(chunkBase_ + chunks);
}

// Rank r reduces chunk r of every rank's input, piece by piece (cache-sized), into its output. In
// place (output == input + r*count) only r reads that chunk of r's input, so nothing is overwritten
// before it is read.
void ShmEngine::reduceScatterDirect(const CollectiveArgs& args) {
  mapPeers(args, false);
  const Fingerprint& fp = args.fingerprint;
  const size_t e = elementBytes();
  const size_t mine = static_cast<size_t>(rank_) * fp.count * e;
  const size_t chunks = numChunks(fp);
  const void* sources[kMaxSources];
  for (size_t c = 0; c < chunks; ++c) {
    const Span s = segment(fp, c, rank_);
    const size_t at = (s.in - static_cast<size_t>(rank_) * fp.count) * e;
    rankOrder(static_cast<const char*>(args.input) + mine + at, [&](int q) { return peerInputs_[q] + mine + at; },
              sources);
    reduceInto(fp.dtype, static_cast<char*>(args.output) + s.out * e, sources, numRanks_, s.len, fp.op,
               1.0f / static_cast<float>(numRanks_));
  }
  publish(slots_[rank_].consumed, chunkBase_ + chunks);
  awaitPeersDone(chunkBase_ + chunks);
}

// Rank r copies every rank's input into that rank's chunk of its own output; in place
// (input == output + r*count) its own chunk is already there.
void ShmEngine::allGatherDirect(const CollectiveArgs& args) {
  mapPeers(args, false);
  const Fingerprint& fp = args.fingerprint;
  const size_t bytes = fp.count * elementBytes();
  auto* output = static_cast<char*>(args.output);
  for (int q = 0; q < numRanks_; ++q) {
    const char* from = q == rank_ ? static_cast<const char*>(args.input) : peerInputs_[q];
    char* to = output + static_cast<size_t>(q) * bytes;
    if (from != to) copyOut(to, from, fp.count, fp.count * static_cast<size_t>(numRanks_));
  }
  const uint64_t end = chunkBase_ + 1;
  publish(slots_[rank_].consumed, end);
  awaitPeersDone(end);
}

// In place is safe: segment r of a rank's input is read only by rank r before it publishes
// `reduced`, and that rank's gather overwrites it only after seeing that.
void ShmEngine::reduceDirect(const CollectiveArgs& args, size_t chunk) {
  const Fingerprint& fp = args.fingerprint;
  const uint64_t g = chunkBase_ + chunk;
  const Span s = segment(fp, chunk, rank_);
  const size_t e = elementBytes();
  const void* sources[kMaxSources];
  rankOrder(static_cast<const char*>(args.input) + s.in * e, [&](int q) { return peerInputs_[q] + s.in * e; }, sources);
  reduceInto(fp.dtype, static_cast<char*>(args.output) + s.out * e, sources, numRanks_, s.len, fp.op,
             1.0f / static_cast<float>(numRanks_));
  RankSlot& mine = slots_[rank_];
  mine.copied.store(g + 1, std::memory_order_relaxed);
  publish(mine.reduced, g + 1);
}

void ShmEngine::gatherDirect(const CollectiveArgs& args, size_t chunk) {
  const Fingerprint& fp = args.fingerprint;
  const uint64_t g = chunkBase_ + chunk;
  waiter_->waitAll([&](int q) { return slots_[q].reduced.load(std::memory_order_acquire) >= g + 1; },
                   "reduce their segment");
  const size_t e = elementBytes();
  for (int q = 0; q < numRanks_; ++q) {
    if (q == rank_) continue;
    const Span s = segment(fp, chunk, q);
    copyOut(static_cast<char*>(args.output) + s.out * e, peerOutputs_[q] + s.out * e, s.len, fp.count);
  }
  publish(slots_[rank_].consumed, g + 1);
}

}  // namespace cohort::collectives::shm
