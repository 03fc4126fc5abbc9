// SharedParams: a model's flat float32 parameters in shared memory, one copy for the local ranks of
// a job (CPU Hogwild, and the sharded synchronous mode), with two optional areas beside them: one
// more shared array (`extra`, e.g. a sharded optimizer state) and one array per rank that the
// others can read (`perRank`, e.g. each rank's gradients). Coordination (barriers, stats) lives in
// ipc::JobSegment, not here.
//
// The local ranks of one node map one ShmRegion, segmentName(jobId, "params"); its payload is
//   offset 0      Control      64 B: magic, numel, localWorldSize, perRankFloats, extraFloats
//   4096          values       numel floats
//   64-aligned    extra        extraFloats floats
//   64-aligned    perRank      localWorldSize x perRankFloats floats, each rank's 64-aligned
// Every rank computes the same layout from the same Options; the control block checks it agrees.
//
// Order of calls (every local rank constructs one SharedParams with the same options):
//   local rank 0: creates the region, calls `initialize(values, numel)` on the zeroed buffer, then
//                 publishes the region;
//   other ranks:  wait (up to options.timeout) for the publication, then attach.
// Rank 0's constructor returns without waiting for the others (line them up with a JobSegment).
//
// Ownership: the object owns its mapping. The name is removed by unlinkName() (once every rank has
// attached) or by rank 0's destructor with Options::unlinkOnDestroy; the launcher removes the job's
// segments at the end anyway (removeJobSegments).
// Thread safety: Hogwild by design: values() is written by all ranks without locks (races between
// float stores are accepted: each store is a whole aligned float, and SGD tolerates lost updates).
// Use std::atomic_ref for values that must not lose updates.
//
//   SharedParams params({.jobId = world.jobId, .localRank = world.localRank,
//                        .localWorldSize = world.localWorldSize, .numel = n},
//                       [&](float* v, size_t n) { std::copy_n(initial, n, v); });
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "ipc/shm_region.h"

namespace cohort::ipc {

class SharedParams {
 public:
  struct Options {
    std::string jobId;
    int localRank = 0;
    int localWorldSize = 1;
    size_t numel = 0;          // floats in values()
    size_t perRankFloats = 0;  // floats in each perRank(r)
    size_t extraFloats = 0;    // floats in extra()
    uint64_t generation = 0;   // of the job (bumped on restart)
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

  // Bytes of shared memory the segment for `options` needs (payload plus header).
  static size_t segmentBytes(const Options& options);

  float* values() const { return values_; }
  size_t numel() const { return numel_; }
  int localRank() const { return localRank_; }
  int localWorldSize() const { return localWorldSize_; }
  float* perRank(int rank) const;
  size_t perRankFloats() const { return perRankFloats_; }
  float* extra() const { return extra_; }
  size_t extraFloats() const { return extraFloats_; }
  const ShmRegion& region() const { return region_; }
  // Removes the segment's name (the mappings stay valid); call once every rank has attached, e.g.
  // after the first barrier. Idempotent.
  void unlinkName() { region_.unlink(); }

 private:
  struct Layout;
  static Layout layoutFor(const Options& options);

  ShmRegion region_;
  float* values_;
  float* perRank_;
  float* extra_;
  size_t numel_;
  size_t extraFloats_;
  size_t perRankFloats_;
  size_t perRankStride_;  // floats between two ranks' areas
  int localRank_;
  int localWorldSize_;
};

}  // namespace cohort::ipc
