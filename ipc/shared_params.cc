#include "ipc/shared_params.h"

#include <new>

#include "runtime/error.h"

namespace cohort::ipc {

namespace {

constexpr uint64_t kParamsMagic = 0x534d524150484f43ull;  // "COHPARMS" read little-endian
constexpr size_t kControlBytes = 64;
constexpr size_t kValuesAlignment = 4096;
constexpr size_t kScratchAlignment = 64;

size_t roundUp(size_t n, size_t to) { return (n + to - 1) / to * to; }

// Written by rank 0 before publishing; every attaching rank checks it against its own options.
struct Control {
  uint64_t magic;
  uint64_t numel;
  uint64_t localWorldSize;
  uint64_t scratchFloatsPerRank;
  uint64_t extraFloats;
};
static_assert(sizeof(Control) <= kControlBytes);

}  // namespace

struct SharedParams::Layout {
  size_t barrierOffset = kControlBytes;
  size_t barrierBytes = 0;
  size_t statsOffset = 0;
  size_t valuesOffset = 0;
  size_t extraOffset = 0;
  size_t scratchOffset = 0;
  size_t scratchStrideFloats = 0;
  size_t payloadBytes = 0;
};

SharedParams::Layout SharedParams::layoutFor(const Options& o) {
  if (o.localWorldSize < 1 || o.localWorldSize > ProcessBarrier::kMaxRanks) {
    COHORT_THROW(InvalidArgument) << "shared parameters need 1.." << ProcessBarrier::kMaxRanks << " local ranks, got "
                                  << o.localWorldSize;
  }
  if (o.localRank < 0 || o.localRank >= o.localWorldSize) {
    COHORT_THROW(InvalidArgument) << "local rank " << o.localRank << " is outside 0.." << o.localWorldSize - 1;
  }
  Layout l;
  const auto ranks = static_cast<size_t>(o.localWorldSize);
  l.barrierBytes = ProcessBarrier::bytesFor(o.localWorldSize);
  l.statsOffset = roundUp(l.barrierOffset + l.barrierBytes, alignof(RankStats));
  l.valuesOffset = roundUp(l.statsOffset + ranks * sizeof(RankStats), kValuesAlignment);
  l.extraOffset = roundUp(l.valuesOffset + o.numel * sizeof(float), kScratchAlignment);
  l.scratchOffset = roundUp(l.extraOffset + o.extraFloats * sizeof(float), kScratchAlignment);
  l.scratchStrideFloats = roundUp(o.scratchFloatsPerRank * sizeof(float), kScratchAlignment) / sizeof(float);
  l.payloadBytes = l.scratchOffset + ranks * l.scratchStrideFloats * sizeof(float);
  return l;
}

size_t SharedParams::segmentBytes(const Options& options) {
  return kSegmentHeaderBytes + layoutFor(options).payloadBytes;
}

ShmRegion SharedParams::makeRegion(const Options& o, const Initializer& initialize) {
  const Layout l = layoutFor(o);
  if (o.localRank != 0) {
    ShmRegion::OpenOptions open{.jobId = o.jobId,
                                .name = o.name,
                                .payloadBytes = l.payloadBytes,
                                .generation = o.generation,
                                .timeout = o.timeout,
                                .creatorDescription = "local rank 0 (the creator)"};
    return ShmRegion::open(open);
  }
  ShmRegion region = ShmRegion::create({.jobId = o.jobId,
                                        .name = o.name,
                                        .payloadBytes = l.payloadBytes,
                                        .generation = o.generation,
                                        .unlinkOnDestroy = o.unlinkOnDestroy});
  char* base = static_cast<char*>(region.payload());  // zeroed by fallocate
  auto* control =
      new (base) Control{kParamsMagic, o.numel, static_cast<uint64_t>(o.localWorldSize), o.scratchFloatsPerRank, o.extraFloats};
  (void)control;
  ProcessBarrier::initialize(base + l.barrierOffset, l.barrierBytes, o.localWorldSize);
  for (int r = 0; r < o.localWorldSize; ++r) new (base + l.statsOffset + r * sizeof(RankStats)) RankStats{};
  if (initialize) initialize(reinterpret_cast<float*>(base + l.valuesOffset), o.numel);
  region.publish();
  return region;
}

SharedParams::SharedParams(const Options& options, const Initializer& initialize)
    : region_(makeRegion(options, initialize)),
      barrier_(static_cast<char*>(region_.payload()) + kControlBytes, layoutFor(options).barrierBytes),
      numel_(options.numel),
      extraFloats_(options.extraFloats),
      scratchFloatsPerRank_(options.scratchFloatsPerRank),
      localRank_(options.localRank),
      localWorldSize_(options.localWorldSize) {
  const Layout l = layoutFor(options);
  char* base = static_cast<char*>(region_.payload());
  const auto* control = reinterpret_cast<const Control*>(base);
  if (control->magic != kParamsMagic || control->numel != options.numel ||
      control->localWorldSize != static_cast<uint64_t>(options.localWorldSize) ||
      control->scratchFloatsPerRank != options.scratchFloatsPerRank || control->extraFloats != options.extraFloats) {
    COHORT_THROW(IoError) << "shared parameters " << region_.path() << " hold " << control->numel << " floats for "
                          << control->localWorldSize << " ranks with " << control->scratchFloatsPerRank
                          << " scratch floats each and " << control->extraFloats << " shared extra floats; local rank "
                          << options.localRank << " expects " << options.numel << ", " << options.localWorldSize << ", "
                          << options.scratchFloatsPerRank << " and " << options.extraFloats
                          << " (do all ranks use the same model and options?)";
  }
  values_ = reinterpret_cast<float*>(base + l.valuesOffset);
  extra_ = reinterpret_cast<float*>(base + l.extraOffset);
  stats_ = reinterpret_cast<RankStats*>(base + l.statsOffset);
  scratch_ = reinterpret_cast<float*>(base + l.scratchOffset);
  scratchStride_ = l.scratchStrideFloats;
  barrier_.registerRank(options.localRank);
}

float* SharedParams::scratch(int rank) const {
  COHORT_CHECK(rank >= 0 && rank < localWorldSize_) << "rank " << rank << " of " << localWorldSize_;
  return scratch_ + static_cast<size_t>(rank) * scratchStride_;
}

RankStats& SharedParams::stats(int rank) const {
  COHORT_CHECK(rank >= 0 && rank < localWorldSize_) << "rank " << rank << " of " << localWorldSize_;
  return stats_[rank];
}

}  // namespace cohort::ipc
