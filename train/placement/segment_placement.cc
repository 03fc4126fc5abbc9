#include "train/placement/segment_placement.h"

#include <algorithm>
#include <vector>

#include "runtime/error.h"

namespace cohort::train {

namespace {

const PlacementContext& checkScope(const PlacementContext& c, NodeScope scope) {
  if (scope == NodeScope::kOneNode && c.world.spansNodes()) {
    COHORT_THROW(InvalidArgument) << "this mode shares memory, so every rank must be on one node, but this job has "
                                  << c.world.worldSize << " ranks with " << c.world.localWorldSize << " on this node";
  }
  return c;
}

}  // namespace

SegmentPlacement::SegmentPlacement(const PlacementContext& c, size_t exchangeFloatsPerRank, NodeScope scope)
    : params_(checkScope(c, scope).params),
      optimizer_(c.optimizer),
      gpu_(c.gpu),
      timeout_(c.timeout),
      nodeTimeout_(c.world.spansNodes() ? c.timeout + c.timeout / 2 : c.timeout),
      timeline_(c.timeline),
      segment_({.jobId = c.world.jobId,
                .localRank = c.world.localRank,
                .localWorldSize = c.world.localWorldSize,
                .exchangeFloatsPerRank = exchangeFloatsPerRank,
                .generation = static_cast<uint64_t>(c.world.restartCount),
                .timeout = c.timeout,
                .unlinkOnDestroy = c.world.localRank == 0}) {}

std::unique_ptr<ipc::SharedParams> SegmentPlacement::shareParams(const PlacementContext& c, size_t perRankFloats,
                                                                size_t extraFloats) {
  auto shared = std::make_unique<ipc::SharedParams>(
      ipc::SharedParams::Options{.jobId = c.world.jobId,
                                 .localRank = localRank(),
                                 .localWorldSize = localWorldSize(),
                                 .numel = params_.numel(),
                                 .perRankFloats = perRankFloats,
                                 .extraFloats = extraFloats,
                                 .generation = static_cast<uint64_t>(c.world.restartCount),
                                 .timeout = c.timeout,
                                 .unlinkOnDestroy = localRank() == 0},
      [&](float* values, size_t n) {
        c.initialise();
        std::copy_n(params_.values().data(), n, values);
      });
  params_.relocate({.values = shared->values(),
                    .device = runtime::Device::cpu(),
                    .allocator = &runtime::cpuAllocator(),
                    .copyValues = false});
  unlinkAfterFirstBarrier([segment = shared.get()] { segment->unlinkName(); });
  return shared;
}

SegmentCollectivesOptions SegmentPlacement::nodeCollectives() {
  return {.barrier = [this](const std::string& what) { nodeBarrier(what); },
          .gatherRows = [this](std::span<const double> mine, int& ranks) { return gatherNode(mine, ranks); },
          .abandon = [this](const Error& error) { segment_.barrier().abandon(segment_.localRank(), error); }};
}

void SegmentPlacement::nodeBarrier(const std::string& what) {
  Timeline::Scope span(timeline_, SpanKind::kBarrier);
  segment_.barrier().arriveAndWait(segment_.localRank(), {.what = what, .timeout = nodeTimeout_});
  if (!unlinked_ && segment_.localRank() == 0) {
    segment_.unlinkName();
    for (const auto& unlink : unlinks_) unlink();
  }
  unlinked_ = true;
}

std::vector<double> SegmentPlacement::gatherNode(std::span<const double> mine, int& ranks) {
  ranks = localWorldSize();
  std::vector<double> all(static_cast<size_t>(ranks) * mine.size());
  for (size_t first = 0; first < mine.size(); first += ipc::JobSegment::kMaxScalars) {
    const size_t n = std::min(ipc::JobSegment::kMaxScalars, mine.size() - first);
    std::span<const double> part =
        segment_.allGather(mine.subspan(first, n), {.what = "reduce", .timeout = nodeTimeout_});
    for (int r = 0; r < ranks; ++r) {
      std::copy_n(part.begin() + static_cast<ptrdiff_t>(static_cast<size_t>(r) * n), n,
                  all.begin() + static_cast<ptrdiff_t>(static_cast<size_t>(r) * mine.size() + first));
    }
  }
  return all;
}

}  // namespace cohort::train
