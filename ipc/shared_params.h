// SharedParams: a job's flat float32 parameter buffer in shared memory, for Hogwild training on CPU.
//
// The local ranks of one node map one ShmRegion, segmentName(jobId, "params"); its payload is
//   offset 0      Control      64 B: magic, numel, localWorldSize, scratchFloatsPerRank (validated)
//   64            barrier      ProcessBarrier::bytesFor(localWorldSize)
//   then          stats        localWorldSize x RankStats (64 B each, one cache line per rank)
//   4096-aligned  values       numel floats
//   64-aligned    extra        extraFloats floats, shared like the values (e.g. sharded optimizer state)
//   64-aligned    scratch      localWorldSize x scratchFloatsPerRank floats, each rank's 64-aligned
// Every rank computes the same layout from the same Options; the control block checks it agrees.
//
// Order of calls (every local rank constructs one SharedParams with the same options):
//   local rank 0: creates the region, initialises control, barrier and stats, calls
//                 `initialize(values, numel)`, then publishes the region;
//   other ranks:  wait (up to options.timeout) for the publication, then attach.
//   every rank:   registers its pid with the barrier; then e.g. barrier().arriveAndWait(localRank, ..).
// Rank 0's constructor returns without waiting for the others; use the barrier to line them up.
//
// Ownership: the object owns its mapping. The segment's name is removed by unlinkName() (once every
// rank has attached) or by rank 0's destructor with Options::unlinkOnDestroy; the launcher removes
// the job's segments at the end anyway (removeJobSegments). Destroying a SharedParams invalidates
// values(), scratch(), barrier() and stats() in this process only.
// Thread safety: Hogwild by design: values() is written by all ranks without locks (races between
// float stores are accepted: each store is a whole aligned float, and SGD tolerates lost updates).
// Use std::atomic_ref for values that must not lose updates. stats() fields are atomics.
//
//   SharedParams params({.jobId = world.jobId, .localRank = world.localRank,
//                        .localWorldSize = world.localWorldSize, .numel = model.numel()},
//                       [&](float* v, size_t n) { model.initParams(v, n); });
//   params.barrier().arriveAndWait(world.localRank, {.what = "start"});
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "ipc/barrier.h"
#include "ipc/shm_region.h"

namespace cohort::ipc {

// One rank's progress counters, in shared memory so rank 0 can report the whole job's throughput.
struct alignas(64) RankStats {
  std::atomic<int64_t> startNs{0};  // e.g. steady_clock nanoseconds when training began
  std::atomic<int64_t> endNs{0};
  std::atomic<int64_t> samples{0};
  std::atomic<int64_t> steps{0};
  std::atomic<int64_t> exchange{0};  // a value this rank publishes for the others between two barriers
};
static_assert(std::atomic<int64_t>::is_always_lock_free, "stats must be lock-free across processes");

class SharedParams {
 public:
  struct Options {
    std::string jobId;
    int localRank = 0;
    int localWorldSize = 1;
    size_t numel = 0;                 // floats in values()
    size_t scratchFloatsPerRank = 0;  // per-rank area (e.g. gathering optimizer state, gradients)
    size_t extraFloats = 0;           // one more area shared by all ranks
    uint64_t generation = 0;          // of the job (bumped on restart)
    std::chrono::milliseconds timeout{std::chrono::seconds(60)};  // others' wait for rank 0
    bool unlinkOnDestroy = false;                                 // rank 0 only: remove the name when destroyed
    std::string name = "params";                                  // segment name within the job
  };
  // Called by local rank 0 only, on the fresh (zeroed) buffer, before anyone else sees it.
  using Initializer = std::function<void(float* values, size_t numel)>;

  // See the order of calls above. Throws InvalidArgument (bad options, a live segment of the same
  // name), IoError (not enough shared memory, a segment laid out differently), TimeoutError / PeerError
  // (rank 0 did not publish in time / died first).
  SharedParams(const Options& options, const Initializer& initialize);
  SharedParams(const SharedParams&) = delete;
  SharedParams& operator=(const SharedParams&) = delete;
  SharedParams(SharedParams&&) = default;
  SharedParams& operator=(SharedParams&&) = default;
  ~SharedParams() = default;

  // Bytes of shared memory the segment for `options` needs (payload plus header).
  static size_t segmentBytes(const Options& options);

  float* values() const { return values_; }
  size_t numel() const { return numel_; }
  int localRank() const { return localRank_; }
  int localWorldSize() const { return localWorldSize_; }
  float* scratch(int rank) const;
  float* extra() const { return extra_; }
  size_t extraFloats() const { return extraFloats_; }
  size_t scratchFloatsPerRank() const { return scratchFloatsPerRank_; }
  ProcessBarrier& barrier() { return barrier_; }
  RankStats& stats(int rank) const;
  const ShmRegion& region() const { return region_; }
  // Removes the segment's name (the mappings stay valid); call once every rank has attached, e.g.
  // after the first barrier. Idempotent.
  void unlinkName() { region_.unlink(); }

 private:
  struct Layout;
  static Layout layoutFor(const Options& options);
  static ShmRegion makeRegion(const Options& options, const Initializer& initialize);

  ShmRegion region_;
  ProcessBarrier barrier_;
  float* values_;
  RankStats* stats_;
  float* scratch_;
  float* extra_ = nullptr;
  size_t numel_;
  size_t extraFloats_;
  size_t scratchFloatsPerRank_;
  size_t scratchStride_;  // floats between two ranks' scratch areas
  int localRank_;
  int localWorldSize_;
};

}  // namespace cohort::ipc
