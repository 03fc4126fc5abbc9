#include "ipc/shared_params.h"

#include <new>

#include "ipc/job_segment.h"
#include "runtime/error.h"

namespace cohort::ipc {

namespace {

constexpr uint64_t kParamsMagic = 0x534d524150484f43ull;  // "COHPARMS" read little-endian
constexpr size_t kValuesOffset = 4096;
constexpr size_t kAlignment = 64;

// Written by rank 0 before publishing; every attaching rank checks it against its own options.
struct Control {
  uint64_t magic;
  uint64_t numel;
  uint64_t localWorldSize;
  uint64_t perRankFloats;
  uint64_t extraFloats;
};
static_assert(sizeof(Control) <= kValuesOffset);

}  // namespace

struct SharedParams::Layout {
  size_t extraOffset = 0;
  size_t perRankOffset = 0;
  size_t perRankStrideFloats = 0;
  size_t payloadBytes = 0;
};

SharedParams::Layout SharedParams::layoutFor(const Options& o) {
  if (o.localWorldSize < 1) COHORT_THROW(InvalidArgument) << "shared parameters need at least one local rank";
  if (o.localRank < 0 || o.localRank >= o.localWorldSize) {
    COHORT_THROW(InvalidArgument) << "local rank " << o.localRank << " is outside 0.." << o.localWorldSize - 1;
  }
  Layout l;
  l.extraOffset = roundUp(kValuesOffset + o.numel * sizeof(float), kAlignment);
  l.perRankOffset = roundUp(l.extraOffset + o.extraFloats * sizeof(float), kAlignment);
  l.perRankStrideFloats = roundUp(o.perRankFloats * sizeof(float), kAlignment) / sizeof(float);
  l.payloadBytes = l.perRankOffset + static_cast<size_t>(o.localWorldSize) * l.perRankStrideFloats * sizeof(float);
  return l;
}

size_t SharedParams::segmentBytes(const Options& options) {
  return kSegmentHeaderBytes + layoutFor(options).payloadBytes;
}

SharedParams::SharedParams(const Options& o, const Initializer& initialize)
    : region_(joinRankRegion({.jobId = o.jobId,
                              .name = o.name,
                              .localRank = o.localRank,
                              .payloadBytes = layoutFor(o).payloadBytes,
                              .generation = o.generation,
                              .timeout = o.timeout,
                              .unlinkOnDestroy = o.unlinkOnDestroy && o.localRank == 0},
                             [&](void* payload) {
                               char* base = static_cast<char*>(payload);
                               new (base) Control{kParamsMagic, o.numel, static_cast<uint64_t>(o.localWorldSize),
                                                  o.perRankFloats, o.extraFloats};
                               if (initialize) initialize(reinterpret_cast<float*>(base + kValuesOffset), o.numel);
                             })),
      numel_(o.numel),
      extraFloats_(o.extraFloats),
      perRankFloats_(o.perRankFloats),
      localRank_(o.localRank),
      localWorldSize_(o.localWorldSize) {
  const Layout l = layoutFor(o);
  char* base = static_cast<char*>(region_.payload());
  const auto* control = reinterpret_cast<const Control*>(base);
  if (control->magic != kParamsMagic || control->numel != o.numel ||
      control->localWorldSize != static_cast<uint64_t>(o.localWorldSize) || control->perRankFloats != o.perRankFloats ||
      control->extraFloats != o.extraFloats) {
    COHORT_THROW(IoError) << "shared parameters " << region_.path() << " hold " << control->numel << " floats for "
                          << control->localWorldSize << " ranks with " << control->perRankFloats
                          << " floats per rank and " << control->extraFloats << " shared extra floats; local rank "
                          << o.localRank << " expects " << o.numel << ", " << o.localWorldSize << ", "
                          << o.perRankFloats << " and " << o.extraFloats
                          << " (do all ranks use the same model and options?)";
  }
  values_ = reinterpret_cast<float*>(base + kValuesOffset);
  extra_ = reinterpret_cast<float*>(base + l.extraOffset);
  perRank_ = reinterpret_cast<float*>(base + l.perRankOffset);
  perRankStride_ = l.perRankStrideFloats;
}

float* SharedParams::perRank(int rank) const {
  COHORT_CHECK(rank >= 0 && rank < localWorldSize_) << "rank " << rank << " of " << localWorldSize_;
  return perRank_ + static_cast<size_t>(rank) * perRankStride_;
}

}  // namespace cohort::ipc
