#include "train/placement/gather_plan.h"

#include <algorithm>

#include "runtime/error.h"

namespace cohort::train {

namespace {

using runtime::WireForm;

struct Run {
  size_t begin = 0, end = 0;  // the unit's elements
  WireForm form = WireForm::kBf16;
};

// Whether a bf16 pass reads any element of the unit rounded: then it goes over the wire.
bool readsBf16(const nn::ParamBuffer& params, const nn::ParamBuffer::Unit& unit) {
  for (size_t e = unit.firstEntry; e < unit.endEntry; ++e) {
    if (params.entries()[e].readAsBf16 && params.entries()[e].numel > 0) return true;
  }
  return false;
}

// The unit's elements [0, numel) in runs of one form (the header): each parameter in its own, the
// padding before it as bf16; neighbours of one form merged.
std::vector<Run> runsOf(const nn::ParamBuffer& params, const nn::ParamBuffer::Unit& unit) {
  std::vector<Run> runs;
  const auto add = [&runs](size_t begin, size_t end, WireForm form) {
    if (begin == end) return;
    if (!runs.empty() && runs.back().form == form) {
      runs.back().end = end;
    } else {
      runs.push_back({.begin = begin, .end = end, .form = form});
    }
  };
  size_t cursor = 0;
  for (size_t e = unit.firstEntry; e < unit.endEntry; ++e) {
    const nn::ParamBuffer::Entry& entry = params.entries()[e];
    const size_t begin = entry.offset - unit.offset;
    add(cursor, begin, WireForm::kBf16);
    add(begin, begin + entry.numel, entry.readAsBf16 ? WireForm::kBf16 : WireForm::kExact);
    cursor = begin + entry.numel;
  }
  COHORT_CHECK(cursor == unit.numel) << "unit " << unit.name << " ends at " << cursor << " of " << unit.numel;
  return runs;
}

// Calls part(begin, count, form) for each run's share of the elements [begin, end), in order.
template <class Part>
void forEachPart(const std::vector<Run>& runs, size_t begin, size_t end, Part part) {
  for (const Run& r : runs) {
    const size_t b = std::max(begin, r.begin), e = std::min(end, r.end);
    if (b < e) part(b, e - b, r.form);
  }
}

}  // namespace

GatherPlan::GatherPlan(const nn::ParamBuffer& params, const nn::ShardMap& map) : units_(map.units()) {
  if (map.units() != params.units().size() || map.numel() != params.numel()) {
    COHORT_THROW(InvalidArgument) << "a gather plan for a shard map of " << map.units() << " units and "
                                  << map.numel() << " elements over parameters of " << params.units().size()
                                  << " units and " << params.numel();
  }
  const auto ranks = static_cast<size_t>(map.worldSize());
  for (size_t u = 0; u < units_.size(); ++u) {
    const nn::ParamBuffer::Unit& unit = params.units()[u];
    if (!readsBf16(params, unit)) continue;
    const std::vector<Run> runs = runsOf(params, unit);
    const size_t piece = map.pieceNumel(u), n = unit.numel;
    const auto begin = [&](size_t r) { return std::min(r * piece, n); };
    const auto end = [&](size_t r) { return std::min(r * piece + piece, n); };
    UnitPlan& plan = units_[u];
    for (size_t r = 0; r < ranks; ++r) {
      uint64_t words = 0;
      forEachPart(runs, begin(r), end(r), [&words](size_t, size_t count, WireForm form) {
        words += runtime::wireWords(form, count);
      });
      plan.words = std::max<size_t>(plan.words, words);
    }
    // Segments from `first` with their words from `wire` on: this rank's piece relative to its first
    // element (pack), or every rank's relative to the unit (unpack).
    const auto append = [&](size_t r, size_t denseBase, uint64_t wire) {
      forEachPart(runs, begin(r), end(r), [&](size_t at, size_t count, WireForm form) {
        runtime::appendWireSegments(table_, {.dense = at - denseBase, .wire = wire, .count = count, .form = form});
        wire += runtime::wireWords(form, count);
      });
    };
    const auto mine = static_cast<size_t>(map.rank());
    plan.pack.first = table_.size();
    append(mine, mine * piece, 0);
    plan.pack.count = table_.size() - plan.pack.first;
    for (size_t r = 0; r < ranks; ++r) {
      plan.rankFirst.push_back(table_.size());
      append(r, 0, r * plan.words);
    }
    plan.rankFirst.push_back(table_.size());
  }
}

GatherPlan::Slice GatherPlan::unpack(size_t u, Ranks ranks) const {
  const UnitPlan& plan = units_.at(u);
  COHORT_CHECK(plan.words > 0) << "unit " << u << " is not gathered over the wire";
  COHORT_CHECK(ranks.first >= 0 && ranks.first <= ranks.end && static_cast<size_t>(ranks.end) < plan.rankFirst.size())
      << "ranks [" << ranks.first << ", " << ranks.end << ") of " << plan.rankFirst.size() - 1;
  const size_t first = plan.rankFirst[static_cast<size_t>(ranks.first)];
  return {.first = first, .count = plan.rankFirst[static_cast<size_t>(ranks.end)] - first};
}

}  // namespace cohort::train
