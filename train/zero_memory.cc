#include "train/zero_memory.h"

#include <algorithm>
#include <functional>

#include "nn/shard_map.h"
#include "runtime/error.h"
#include "train/placement/gather_plan.h"

namespace cohort::train {

namespace {

constexpr size_t kFloat = sizeof(float);

size_t ceilDiv(size_t n, size_t w) { return (n + w - 1) / w; }

// The bytes of the `count` largest units, each padded to ceil(n/W)·W floats.
size_t largestPaddedBytes(std::vector<size_t> units, size_t w, size_t count) {
  std::sort(units.begin(), units.end(), std::greater<>());
  size_t floats = 0;
  for (size_t u = 0; u < std::min(count, units.size()); ++u) floats += ceilDiv(units[u], w) * w;
  return floats * kFloat;
}

// bf16 runs: the message buffers of the `count` units with the largest messages, each W slots of
// `words` 16-bit words in whole floats (the window pool's unit).
size_t largestMessageBytes(std::vector<size_t> words, size_t w, size_t count) {
  std::sort(words.begin(), words.end(), std::greater<>());
  size_t floats = 0;
  for (size_t u = 0; u < std::min(count, words.size()); ++u) floats += (words[u] * w + 1) / 2;
  return floats * kFloat;
}

}  // namespace

size_t optimizerStateFloats(const nn::OptimizerOptions& optimizer) {
  if (optimizer.kind == nn::OptimizerKind::kSgd) return optimizer.momentum != 0.0f ? 1 : 0;
  return 2;
}

int shardGroupSize(const runtime::WorldInfo& world, ZeroScope scope) {
  return scope == ZeroScope::kNode ? world.localWorldSize : world.worldSize;
}

StateBytes zeroStateBytes(const ZeroMemoryOptions& o) {
  if (o.stage < 0 || o.stage > kMaxZeroStage) {
    COHORT_THROW(InvalidArgument) << "ZeRO stage " << o.stage << " does not exist: 0, 1, 2 or 3";
  }
  if (o.groupSize < 1) COHORT_THROW(InvalidArgument) << "a shard group of " << o.groupSize << " ranks";
  if (!o.gatherWords.empty() && o.gatherWords.size() != o.units.size()) {
    COHORT_THROW(InvalidArgument) << "gather words for " << o.gatherWords.size() << " units of " << o.units.size();
  }
  // Every precision keeps fp32 master weights, gradients and optimizer state (the header).
  const size_t w = static_cast<size_t>(o.groupSize);
  const bool messages = o.precision == runtime::DType::kBF16 && !o.gatherWords.empty();
  size_t whole = 0, shard = 0, padded = 0;  // floats: N, N/W as packed, the padded units' staging
  for (size_t u = 0; u < o.units.size(); ++u) {
    const size_t n = o.units[u];
    whole += n;
    shard += ceilDiv(n, w);
    const bool sent = messages && o.gatherWords[u] > 0;  // stage 2 stages no message unit
    if (n % w != 0 && !(sent && o.stage == 2)) padded += ceilDiv(n, w) * w;
  }
  const size_t state = optimizerStateFloats(o.optimizer);
  StateBytes b{.params = whole * kFloat, .grads = whole * kFloat, .optimizer = state * whole * kFloat};
  if (o.stage == 0) return b;
  b.optimizer = state * shard * kFloat;
  if (o.stage >= 2) b.grads = shard * kFloat;
  if (o.stage == 3) b.params = shard * kFloat;
  if (o.stage <= 2) b.staging = padded * kFloat;
  const size_t gradientWindows = o.stage >= 2 ? largestPaddedBytes(o.units, w, kGradientWindows) : 0;
  b.staging += gradientWindows;
  if (o.stage == 3) b.staging += largestPaddedBytes(o.units, w, kParameterWindows);
  if (!messages) return b;
  const size_t sent = largestMessageBytes(o.gatherWords, w, o.stage == 3 ? 1 : kMessagesInFlight);
  // Stage 2 gathers after the step, when the gradient windows are back in the pool: the messages
  // take those first. Stage 3's is in flight while backward holds them.
  b.staging += o.stage == 2 ? sent - std::min(sent, gradientWindows) : sent;
  return b;
}

std::vector<size_t> bf16GatherWords(const nn::ParamBuffer& params, int groupSize) {
  const nn::ShardMap map = nn::shardMapOf(params, {.worldSize = groupSize, .rank = 0});
  const GatherPlan plan(params, map);
  std::vector<size_t> words;
  for (size_t u = 0; u < map.units(); ++u) words.push_back(plan.words(u));
  return words;
}

size_t zeroPlacementPeakBytes(const ZeroMemoryOptions& o) {
  const StateBytes steady = zeroStateBytes(o);
  if (o.stage == 0) return steady.total();
  size_t whole = 0;
  for (size_t n : o.units) whole += n;
  const size_t wholeBytes = whole * kFloat;
  if (o.onGpu) return 2 * wholeBytes + steady.optimizer + (o.stage >= 2 ? steady.grads : 0) + (o.stage == 3 ? steady.params : 0);
  if (o.stage <= 2) return 2 * wholeBytes + steady.optimizer;
  return wholeBytes + steady.params + steady.optimizer;
}

}  // namespace cohort::train
