#include "ipc/job_segment.h"

#include <algorithm>
#include <new>

#include "runtime/error.h"

namespace cohort::ipc {

namespace {

constexpr uint64_t kJobMagic = 0x424f4a54524f4843ull;  // "CHORTJOB" read little-endian
constexpr size_t kControlBytes = 64;
constexpr size_t kAlignment = 64;

struct Control {
  uint64_t magic;
  uint64_t localWorldSize;
  uint64_t exchangeFloatsPerRank;
};
static_assert(sizeof(Control) <= kControlBytes);

}  // namespace

ShmRegion joinRankRegion(const RankRegionOptions& o, const std::function<void(void* payload)>& initialise) {
  if (o.localRank != 0) {
    return ShmRegion::open({.jobId = o.jobId,
                            .name = o.name,
                            .payloadBytes = o.payloadBytes,
                            .generation = o.generation,
                            .timeout = o.timeout,
                            .creatorDescription = "local rank 0 (the creator)"});
  }
  ShmRegion region = ShmRegion::create({.jobId = o.jobId,
                                        .name = o.name,
                                        .payloadBytes = o.payloadBytes,
                                        .generation = o.generation,
                                        .unlinkOnDestroy = o.unlinkOnDestroy});
  if (initialise) initialise(region.payload());  // zeroed by fallocate
  region.publish();
  return region;
}

struct JobSegment::Layout {
  size_t barrierBytes = 0;
  size_t scalarsOffset = 0;
  size_t exchangeOffset = 0;
  size_t exchangeStrideFloats = 0;
  size_t payloadBytes = 0;
};

JobSegment::Layout JobSegment::layoutFor(const Options& o) {
  if (o.localWorldSize < 1 || o.localWorldSize > ProcessBarrier::kMaxRanks) {
    COHORT_THROW(InvalidArgument) << "a job segment needs 1.." << ProcessBarrier::kMaxRanks << " local ranks, got "
                                  << o.localWorldSize;
  }
  if (o.localRank < 0 || o.localRank >= o.localWorldSize) {
    COHORT_THROW(InvalidArgument) << "local rank " << o.localRank << " is outside 0.." << o.localWorldSize - 1;
  }
  Layout l;
  const auto ranks = static_cast<size_t>(o.localWorldSize);
  l.barrierBytes = ProcessBarrier::bytesFor(o.localWorldSize);
  l.scalarsOffset = roundUp(kControlBytes + l.barrierBytes, kAlignment);
  l.exchangeOffset = roundUp(l.scalarsOffset + ranks * 2 * kMaxScalars * sizeof(double), kAlignment);
  l.exchangeStrideFloats = roundUp(o.exchangeFloatsPerRank * sizeof(float), kAlignment) / sizeof(float);
  l.payloadBytes = l.exchangeOffset + ranks * l.exchangeStrideFloats * sizeof(float);
  return l;
}

size_t JobSegment::segmentBytes(const Options& options) { return kSegmentHeaderBytes + layoutFor(options).payloadBytes; }

JobSegment::JobSegment(const Options& o)
    : region_(joinRankRegion({.jobId = o.jobId,
                              .name = o.name,
                              .localRank = o.localRank,
                              .payloadBytes = layoutFor(o).payloadBytes,
                              .generation = o.generation,
                              .timeout = o.timeout,
                              .unlinkOnDestroy = o.unlinkOnDestroy && o.localRank == 0},
                             [&](void* payload) {
                               const Layout l = layoutFor(o);
                               char* base = static_cast<char*>(payload);
                               new (base) Control{kJobMagic, static_cast<uint64_t>(o.localWorldSize),
                                                  o.exchangeFloatsPerRank};
                               ProcessBarrier::initialize(base + kControlBytes, l.barrierBytes, o.localWorldSize);
                             })),
      barrier_(static_cast<char*>(region_.payload()) + kControlBytes, layoutFor(o).barrierBytes),
      exchangeFloatsPerRank_(o.exchangeFloatsPerRank),
      localRank_(o.localRank),
      localWorldSize_(o.localWorldSize) {
  const Layout l = layoutFor(o);
  char* base = static_cast<char*>(region_.payload());
  const auto* control = reinterpret_cast<const Control*>(base);
  if (control->magic != kJobMagic || control->localWorldSize != static_cast<uint64_t>(o.localWorldSize) ||
      control->exchangeFloatsPerRank != o.exchangeFloatsPerRank) {
    COHORT_THROW(IoError) << "job segment " << region_.path() << " is laid out for " << control->localWorldSize
                          << " ranks with " << control->exchangeFloatsPerRank << " exchange floats each; local rank "
                          << o.localRank << " expects " << o.localWorldSize << " and " << o.exchangeFloatsPerRank
                          << " (do all ranks use the same model and options?)";
  }
  scalars_ = reinterpret_cast<double*>(base + l.scalarsOffset);
  exchange_ = reinterpret_cast<float*>(base + l.exchangeOffset);
  exchangeStride_ = l.exchangeStrideFloats;
  barrier_.registerRank(o.localRank);
}

double* JobSegment::slot(int rank, uint64_t set) const {
  return scalars_ + (static_cast<size_t>(rank) * 2 + set % 2) * kMaxScalars;
}

std::span<const double> JobSegment::allGather(std::span<const double> mine, const ProcessBarrier::WaitOptions& wait) {
  COHORT_CHECK(mine.size() <= kMaxScalars) << mine.size() << " scalars, at most " << kMaxScalars;
  const uint64_t set = calls_++;
  std::copy(mine.begin(), mine.end(), slot(localRank_, set));
  barrier_.arriveAndWait(localRank_, wait);  // release/acquire: everyone's values are visible after it
  gathered_.resize(mine.size() * static_cast<size_t>(localWorldSize_));
  for (int r = 0; r < localWorldSize_; ++r) {
    std::copy_n(slot(r, set), mine.size(), gathered_.begin() + static_cast<ptrdiff_t>(r * mine.size()));
  }
  return gathered_;
}

float* JobSegment::exchange(int rank) const {
  COHORT_CHECK(rank >= 0 && rank < localWorldSize_) << "rank " << rank << " of " << localWorldSize_;
  return exchange_ + static_cast<size_t>(rank) * exchangeStride_;
}

}  // namespace cohort::ipc
