// ShmEngine: runs one collective at a time over the job segment "cohort.<jobId>.<scope>comm"
// (shm_layout.h; scope "" for the job's communicator, "s<k>c<color>-" and so on for a group made
// by split()); the ShmCommunicator calls it from its progress thread. Algorithm:
// docs/collectives.md.
//
// Reduce-scatter then all-gather, in chunks. A chunk of an all-reduce is split into one segment per
// rank; chunk g (counted over the communicator's life) uses staging slot g % kSlots of every rank:
//   copyIn  rank r copies every segment q != r of its input chunk into its own staging slot
//           (after every rank has finished reading that slot's previous chunk), publishes `copied`;
//   reduce  rank r reduces segment r: its own input plus segment r of every peer's slot, into
//           segment r of its own slot, publishes `reduced`, and copies it to its output;
//   gather  rank r copies segment q of rank q's slot into its output for every q != r, publishes
//           `consumed` (it no longer reads chunk g's slots).
// The phases of chunks g, g-1 and g-2 run back to back (copyIn(g), reduce(g-1), gather(g-2)), so
// ranks drift by up to a few chunks instead of meeting at every phase. Reduce-scatter is copyIn +
// reduce, all-gather is copyIn + gather, broadcast streams the root's chunks through its slots.
// Both take NCCL's in-place layout as it comes: rank r's chunk of the full buffer is never staged
// by r nor written by anyone but r.
// Direct paths, without staging, when the buffers lie in shared buffers (Communicator::
// allocateBuffer, shm_buffers.h) on every rank, each mapped where it lies:
//   all-reduce (larger than kSmallBytes; input and output shared): rank r reduces segment r of
//     every rank's input into its own output and publishes `reduced`; then copies segment q of rank
//     q's output into its own for every q != r and publishes `consumed`. The reduce of chunk g and
//     the gather of chunk g-1 run back to back.
//   reduce-scatter (inputs shared): rank r reduces chunk r of every rank's input into its output.
//   all-gather (inputs shared): rank r copies every rank's input into its chunk of its output.
// Before returning from a direct collective, a rank waits until every peer has consumed every
// chunk, since they read its buffers until then.
// Elements are fp32 or bf16 (the fingerprint's dtype): a slot's segments keep their fp32 size, and
// bf16 sums accumulate in fp32 and round once (reduce_kernels.h).
// All-reduces of at most kSmallBytes take a one-shot path: each rank stages its whole input, publishes
// it together with its fingerprint, and reduces everything into its output.
// Before any data moves, each rank publishes its Fingerprint and checks every rank's (a mismatch is
// an InvalidArgument on every rank; nothing is touched); this exchange is also the barrier.
//
// Ownership: owns the segment mapping; local rank 0 creates the segment and unlinks its name once
// every rank has mapped it, so nothing is left behind however the job ends.
// Thread safety: run() from one thread at a time (the progress thread).
#pragma once

#include <chrono>
#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "collectives/communicator.h"
#include "collectives/shm/shm_buffers.h"
#include "collectives/shm/shm_layout.h"
#include "collectives/shm/shm_waiter.h"
#include "ipc/shm_region.h"
#include "runtime/world_info.h"

namespace cohort::collectives::shm {

inline constexpr size_t kDefaultChunkBytes = size_t{1} << 20;
inline constexpr size_t kSmallBytes = size_t{64} << 10;
inline constexpr size_t kStreamingBytes = size_t{32} << 20;  // outputs this large use streaming stores

// One collective as the engine sees it. Broadcast uses output (input == output). The refs say where
// input and output lie when they are in this rank's shared buffers (all-reduce, reduce-scatter,
// all-gather; see ShmEngine::directRefs).
struct CollectiveArgs {
  Fingerprint fingerprint;
  const void* input = nullptr;
  void* output = nullptr;
  BufferRef inputRef;
  BufferRef outputRef;
};

class ShmEngine {
 public:
  struct Options {
    runtime::WorldInfo world;
    std::chrono::milliseconds timeout{std::chrono::seconds(300)};  // set-up and every collective
    size_t chunkBytes = kDefaultChunkBytes;                        // rounded down to a multiple of 64 * numRanks
    size_t streamingBytes = kStreamingBytes;                       // outputs at least this large use streaming stores
    // Prefixed to the names of the segments (the communicator's and its shared buffers'): "" for
    // the job's communicator, the parent's scope and groupScope() for a group made by split().
    std::string scope;
  };

  // Creates (local rank 0) or opens the segment, registers this rank and waits for all ranks.
  explicit ShmEngine(const Options& options);
  ShmEngine(const ShmEngine&) = delete;
  ShmEngine& operator=(const ShmEngine&) = delete;

  int rank() const { return rank_; }
  int size() const { return numRanks_; }

  // Runs one collective to completion; throws InvalidArgument / PeerError / TimeoutError.
  void run(const CollectiveArgs& args);

  // Whether a collective of `fp` may take a direct path, so its refs are worth looking up: the
  // bytes of its input and output (0: not direct, no lookup).
  struct DirectBytes {
    size_t input = 0;
    size_t output = 0;
  };
  DirectBytes directBytes(const Fingerprint& fp) const;

  // Maps rank q's shared buffer `id` of `dataBytes` (Communicator::allocateBuffer, once q has
  // published it); any thread.
  void mapPeerBuffer(int q, uint64_t id, size_t dataBytes) { peerBuffers_->open(q, id, dataBytes); }

 private:
  struct Span {
    size_t in = 0;
    size_t out = 0;
    size_t len = 0;
  };
  // What a rank published for one collective.
  struct Published {
    Fingerprint fingerprint;
    BufferRef input;
    BufferRef output;
  };
  void setUp(const Options& options);
  // Which of every rank's buffers lie in shared buffers (only then are they all read).
  struct Sharing {
    bool inputs = true;
    bool outputs = true;
  };
  Sharing exchangeFingerprints(const CollectiveArgs& args);
  bool readPublished(int q, uint64_t sequence, Published& published, bool& passed) const;
  void runSingleRank(const CollectiveArgs& args) const;
  void allReduceSmall(const CollectiveArgs& args);
  void pipeline(const CollectiveArgs& args);
  void broadcast(const CollectiveArgs& args);
  size_t numChunks(const Fingerprint& fp) const;
  Span segment(const Fingerprint& fp, size_t chunk, int q) const;
  void waitSlotFree(uint64_t g);
  void copyIn(const CollectiveArgs& args, size_t chunk);
  void reduce(const CollectiveArgs& args, size_t chunk);
  void gather(const CollectiveArgs& args, size_t chunk);
  void allReduceDirect(const CollectiveArgs& args);
  void reduceDirect(const CollectiveArgs& args, size_t chunk);
  // The sources of a reduction in rank order: this rank's `own`, every other rank q's `peer(q)`, so
  // that every element is added in the same order whichever rank reduces it (an all-reduce and a
  // reduce-scatter of the same inputs give the same bits; docs/collectives.md).
  template <class Peer>
  void rankOrder(const void* own, Peer peer, const void** sources) const {
    for (int q = 0; q < numRanks_; ++q) sources[q] = q == rank_ ? own : peer(q);
  }
  void gatherDirect(const CollectiveArgs& args, size_t chunk);
  void mapPeers(const CollectiveArgs& args, bool outputs);
  void reduceScatterDirect(const CollectiveArgs& args);
  void allGatherDirect(const CollectiveArgs& args);
  void awaitPeersDone(uint64_t end);
  size_t elementBytes() const { return runtime::sizeOf(dtype_); }
  void copyOut(void* out, const void* in, size_t len, size_t totalElems) const;
  char* stage(int owner, uint64_t g, int segmentIndex) const;
  void publish(std::atomic<uint64_t>& counter, uint64_t value);

  int rank_ = 0;
  int numRanks_ = 1;
  std::chrono::milliseconds timeout_;
  size_t chunkElems_ = 0;  // elements per chunk (a multiple of 16 * numRanks)
  size_t segElems_ = 0;    // chunkElems_ / numRanks: one segment, 64-byte aligned
  size_t streamingBytes_ = kStreamingBytes;
  uint64_t chunkBase_ = 0;                       // chunks completed by earlier collectives
  runtime::DType dtype_ = runtime::DType::kF32;  // the running collective's
  std::optional<ipc::ShmRegion> region_;
  RankSlot* slots_ = nullptr;
  char* staging_ = nullptr;
  std::optional<Waiter> waiter_;
  std::optional<PeerBuffers> peerBuffers_;
  std::vector<Published> published_;     // every rank's, from the last exchangeFingerprints
  std::vector<const char*> peerInputs_;  // direct paths: each rank's input, mapped here
  std::vector<const char*> peerOutputs_;
};

}  // namespace cohort::collectives::shm
