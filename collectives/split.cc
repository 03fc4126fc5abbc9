#include "collectives/split.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <numeric>

#include "runtime/error.h"

namespace cohort::collectives {

SplitPlan planSplit(Communicator& parent, const SplitOptions& options, std::chrono::milliseconds timeout) {
  // Each rank's color and key travel as raw bits: four 16-bit elements, which every backend's bf16
  // all-gather moves unchanged (no value of either is lost as a float would lose it).
  const int32_t mine[2] = {options.color, options.key};
  uint16_t bits[4];
  std::memcpy(bits, mine, sizeof mine);
  const auto n = static_cast<size_t>(parent.size());
  std::vector<uint16_t> all(4 * n);
  parent.allGather(bits, all.data(), 4, {.dtype = runtime::DType::kBF16})->wait(timeout);
  std::vector<int> colors(n), keys(n);
  for (size_t r = 0; r < n; ++r) {
    int32_t pair[2];
    std::memcpy(pair, &all[4 * r], sizeof pair);
    colors[r] = pair[0];
    keys[r] = pair[1];
  }
  return planFrom(std::move(colors), std::move(keys), parent.rank());
}

SplitPlan planFrom(std::vector<int> colors, std::vector<int> keys, int rank) {
  for (size_t r = 0; r < colors.size(); ++r) {
    if (colors[r] < SplitOptions::kNoGroup) {
      COHORT_THROW(InvalidArgument) << "split: rank " << r << " passed color " << colors[r]
                                    << "; a color is >= 0, or SplitOptions::kNoGroup (-1) for no group";
    }
  }
  SplitPlan plan;
  plan.color = colors[static_cast<size_t>(rank)];
  if (plan.color != SplitOptions::kNoGroup) {
    for (size_t r = 0; r < colors.size(); ++r) {
      if (colors[r] == plan.color) plan.members.push_back(static_cast<int>(r));
    }
    std::stable_sort(plan.members.begin(), plan.members.end(),
                     [&](int a, int b) { return keys[static_cast<size_t>(a)] < keys[static_cast<size_t>(b)]; });
    plan.rank = static_cast<int>(std::find(plan.members.begin(), plan.members.end(), rank) - plan.members.begin());
  }
  plan.colors = std::move(colors);
  plan.keys = std::move(keys);
  return plan;
}

std::unique_ptr<Communicator> splitNodeRanks(Communicator& world, const runtime::WorldInfo& info) {
  // This rank's place among the ranks of its local rank is its node: its rank in the group of its
  // local rank (made through split(), which every backend can gather for, device memory included).
  const int node = world.split({.color = info.localRank})->rank();
  return world.split({.color = node, .key = info.localRank});
}

std::unique_ptr<Communicator> splitSameLocalRank(Communicator& world, const runtime::WorldInfo& info) {
  return world.split({.color = info.localRank});
}

std::string groupScope(uint64_t index, int color) {
  return "s" + std::to_string(index) + "c" + std::to_string(color) + "-";
}

std::unique_ptr<Communicator> Communicator::split(const SplitOptions&) {
  COHORT_THROW(InvalidArgument) << "this communicator (backend '" << backend() << "') cannot be split";
}

}  // namespace cohort::collectives
