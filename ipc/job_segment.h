// JobSegment: the coordination segment of the local ranks of one job: a ProcessBarrier, a small
// all-gather of scalars and one exchange area per rank, in the shared-memory segment
// segmentName(jobId, "job"). Training strategies on one node line their workers up with it
// (barriers, scalar exchanges, gathering every rank's optimizer state for a checkpoint); it holds
// no parameters (those are ipc::SharedParams or ipc::DeviceShare).
//
// Payload layout (every rank computes it from the same Options; the control block checks it):
//   offset 0       Control     64 B: magic, localWorldSize, exchangeFloatsPerRank
//   64             barrier     ProcessBarrier::bytesFor(localWorldSize)
//   64-aligned     scalars     localWorldSize x 2 x kMaxScalars doubles (two sets, used in turn)
//   64-aligned     exchange    localWorldSize x exchangeFloatsPerRank floats, each rank's 64-aligned
//
// Order of calls: every local rank constructs one with the same options. Local rank 0 creates the
// segment, initialises it and publishes it; the others wait for it (up to options.timeout). Every
// rank registers its pid with the barrier, so a rank that dies is a PeerError for the others.
// Rank 0's constructor returns without waiting for the others: line them up with the barrier.
//
// Ownership: owns its mapping. unlinkName() removes the name (call it once every rank has attached,
// e.g. after the first barrier); Options::unlinkOnDestroy makes rank 0's destructor do it; the
// launcher removes a job's segments at its end anyway.
// Thread safety: each rank uses its JobSegment from one thread at a time; the exchange areas are raw
// memory, ordered by the barrier.
//
//   JobSegment segment({.jobId = world.jobId, .localRank = world.localRank,
//                       .localWorldSize = world.localWorldSize});
//   segment.barrier().arriveAndWait(world.localRank, {.what = "start"});
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "ipc/barrier.h"
#include "ipc/shm_region.h"

namespace cohort::ipc {

// Where a local rank finds a job segment: local rank 0 creates it, runs `initialise(payload)` on the
// zeroed payload and publishes it; every other rank waits for the publication (up to `timeout`).
// Throws as ShmRegion::create/open.
struct RankRegionOptions {
  std::string jobId;
  std::string name;
  int localRank = 0;
  size_t payloadBytes = 0;
  uint64_t generation = 0;
  std::chrono::milliseconds timeout{std::chrono::seconds(60)};
  bool unlinkOnDestroy = false;  // rank 0 only
};
ShmRegion joinRankRegion(const RankRegionOptions& options, const std::function<void(void* payload)>& initialise);

class JobSegment {
 public:
  struct Options {
    std::string jobId;
    int localRank = 0;
    int localWorldSize = 1;
    size_t exchangeFloatsPerRank = 0;  // e.g. each rank's optimizer state, gathered for checkpoints
    uint64_t generation = 0;           // the launcher's restart count: a restarted job makes a fresh one
    std::chrono::milliseconds timeout{std::chrono::seconds(60)};  // others' wait for rank 0
    bool unlinkOnDestroy = false;
    std::string name = "job";
  };

  // Throws InvalidArgument (bad options, a live segment of that name), IoError (not enough shared
  // memory, a segment laid out differently), TimeoutError / PeerError (rank 0 did not publish in
  // time / died first).
  explicit JobSegment(const Options& options);
  JobSegment(const JobSegment&) = delete;
  JobSegment& operator=(const JobSegment&) = delete;

  static size_t segmentBytes(const Options& options);

  static constexpr size_t kMaxScalars = 8;

  int localRank() const { return localRank_; }
  int localWorldSize() const { return localWorldSize_; }
  ProcessBarrier& barrier() { return barrier_; }
  // Collective: every local rank calls it the same number of times, with the same number of values
  // (at most kMaxScalars). Publishes `mine`, passes the barrier (named by `wait`) and returns every
  // rank's values, rank-major (rank r's at [r·n, (r+1)·n)); the view is valid until the next call.
  // Two sets of slots used in turn make one barrier per call enough: a rank rewrites a set only
  // after the next call's barrier, which every rank passes only once it has read this one.
  std::span<const double> allGather(std::span<const double> mine, const ProcessBarrier::WaitOptions& wait);
  float* exchange(int rank) const;
  size_t exchangeFloatsPerRank() const { return exchangeFloatsPerRank_; }
  void unlinkName() { region_.unlink(); }

 private:
  struct Layout;
  static Layout layoutFor(const Options& options);

  double* slot(int rank, uint64_t set) const;

  ShmRegion region_;
  ProcessBarrier barrier_;
  double* scalars_;
  uint64_t calls_ = 0;
  std::vector<double> gathered_;
  float* exchange_;
  size_t exchangeFloatsPerRank_;
  size_t exchangeStride_;
  int localRank_;
  int localWorldSize_;
};

}  // namespace cohort::ipc
