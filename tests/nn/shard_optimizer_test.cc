// Optimizers over a shard map: every rank stepping its packed shard gives, bit for bit, the slices
// of the whole buffer's step, for every optimizer and option (weight decay, momentum, Nesterov,
// Adam's bias corrections from a resumed step count), over several steps, at world sizes 1..5; the
// state is sized to the shard and the padding stays zero.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "nn/optimizer.h"
#include "nn/shard_map.h"
#include "runtime/error.h"
#include "runtime/random.h"

namespace cohort::nn {
namespace {

using runtime::Shape;

const std::vector<ShardMap::Unit> kUnits = {{"embed", 37}, {"empty", 0}, {"block0", 5}, {"block1", 1100}, {"head", 3}};

Tensor tensorOf(const std::vector<float>& v) {
  Tensor t = Tensor::zeros(Shape{static_cast<int64_t>(v.size())});
  std::copy(v.begin(), v.end(), t.data());
  return t;
}

std::vector<float> valuesOf(const Tensor& t) { return std::vector<float>(t.data(), t.data() + t.numel()); }

std::vector<float> randomValues(size_t n, uint64_t seed) {
  runtime::Rng rng(seed);
  std::vector<float> v(n);
  for (float& x : v) x = rng.uniform(-2.0f, 2.0f);
  return v;
}

bool sameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

struct Case {
  const char* name;
  OptimizerOptions options;
  int64_t startSteps = 0;  // a resumed count: Adam's bias corrections and SGD's first step depend on it
};

const std::vector<Case> kCases = {
    {"sgd", {.kind = OptimizerKind::kSgd, .lr = 0.05f}},
    {"sgd+wd", {.kind = OptimizerKind::kSgd, .lr = 0.05f, .weightDecay = 0.1f}},
    {"momentum+wd", {.kind = OptimizerKind::kSgd, .lr = 0.05f, .momentum = 0.9f, .weightDecay = 0.01f}},
    {"nesterov+wd",
     {.kind = OptimizerKind::kSgd, .lr = 0.05f, .momentum = 0.5f, .nesterov = true, .weightDecay = 0.3f}},
    {"adam+wd", {.kind = OptimizerKind::kAdam, .lr = 3e-3f, .weightDecay = 0.02f}},
    {"adamw", {.kind = OptimizerKind::kAdamW, .lr = 3e-3f, .weightDecay = 0.01f}},
    {"adamw resumed", {.kind = OptimizerKind::kAdamW, .lr = 1e-2f, .weightDecay = 0.1f, .beta1 = 0.8f}, 7},
    {"momentum resumed", {.kind = OptimizerKind::kSgd, .lr = 0.05f, .momentum = 0.9f}, 3},
};

// The whole step against each rank's shard step, `steps` times with fresh gradients each step.
void expectShardsMatchWhole(const Case& c, int world, int steps) {
  SCOPED_TRACE(std::string(c.name) + ", world " + std::to_string(world));
  const ShardMap layout(kUnits, {.worldSize = world, .rank = 0});
  const size_t n = layout.numel();
  Tensor whole = tensorOf(randomValues(n, 1));
  auto wholeOptimizer = makeOptimizer(c.options, n);
  wholeOptimizer->setSteps(c.startSteps);

  std::vector<ShardMap> maps;
  std::vector<std::unique_ptr<Optimizer>> optimizers;
  std::vector<Tensor> shards;
  for (int r = 0; r < world; ++r) {
    maps.emplace_back(kUnits, ShardMap::Options{.worldSize = world, .rank = r});
    optimizers.push_back(makeShardOptimizer(c.options, maps.back()));
    optimizers.back()->setSteps(c.startSteps);
    ASSERT_EQ(optimizers.back()->numel(), layout.shardNumel());
    for (const auto& s : optimizers.back()->state())
      ASSERT_EQ(static_cast<size_t>(s.tensor.numel()), layout.shardNumel());
    shards.push_back(Tensor::zeros(Shape{static_cast<int64_t>(layout.shardNumel())}));
    maps.back().pack(whole.data(), r, shards.back().data());
  }

  for (int step = 0; step < steps; ++step) {
    const std::vector<float> grads = randomValues(n, 100 + static_cast<uint64_t>(step));
    wholeOptimizer->step(whole, tensorOf(grads));
    std::vector<float> gathered(n, -9.0f);
    for (int r = 0; r < world; ++r) {
      Tensor gradShard = Tensor::zeros(Shape{static_cast<int64_t>(layout.shardNumel())});
      maps[r].pack(grads.data(), r, gradShard.data());
      optimizers[r]->stepShard(shards[r], gradShard);
      maps[r].unpack(shards[r].data(), r, gathered.data());
      for (const ShardMap::Piece& p : maps[r].pieces(r)) {
        for (size_t i = p.realNumel(); i < p.numel; ++i)
          EXPECT_EQ(shards[r].at(static_cast<int64_t>(p.shardOffset + i)), 0.0f);
      }
      EXPECT_EQ(optimizers[r]->steps(), wholeOptimizer->steps());
    }
    ASSERT_TRUE(sameBits(gathered, valuesOf(whole))) << "step " << step;
  }
  // The state too: each rank's shard of it is the whole state's slice.
  const auto wholeState = wholeOptimizer->state();
  for (size_t s = 0; s < wholeState.size(); ++s) {
    std::vector<float> gathered(n, -9.0f);
    for (int r = 0; r < world; ++r) maps[r].unpack(optimizers[r]->state()[s].tensor.data(), r, gathered.data());
    EXPECT_TRUE(sameBits(gathered, valuesOf(wholeState[s].tensor))) << wholeState[s].name;
  }
}

TEST(ShardOptimizer, EveryRanksShardStepIsTheWholeStepsSliceBitForBit) {
  for (const Case& c : kCases) {
    for (int world = 1; world <= 5; ++world) expectShardsMatchWhole(c, world, 4);
  }
}

// Parameter groups over the flat buffer (1145 elements) that cross the units' edges (37, 42, 1142)
// and so the ranks' pieces: each shard element steps with its flat index's group.
const std::vector<ParamGroup> kGroups = {{.begin = 3, .end = 40, .weightDecay = 0.2f},
                                         {.begin = 40, .end = 700, .weightDecay = 0.0f, .lrScale = 0.5f},
                                         {.begin = 900, .end = 1144, .weightDecay = 0.05f, .lrScale = 3.0f}};
const std::vector<Case> kGroupedCases = {
    {"adamw groups", {.kind = OptimizerKind::kAdamW, .lr = 3e-3f, .weightDecay = 0.01f, .groups = kGroups}},
    {"adam groups", {.kind = OptimizerKind::kAdam, .lr = 3e-3f, .weightDecay = 0.01f, .groups = kGroups}, 2},
    {"momentum groups",
     {.kind = OptimizerKind::kSgd, .lr = 0.05f, .momentum = 0.9f, .weightDecay = 0.1f, .groups = kGroups}},
};

TEST(ShardOptimizer, GroupsCrossingPiecesStepAsTheWholeBuffer) {
  for (const Case& c : kGroupedCases) {
    for (int world = 1; world <= 5; ++world) expectShardsMatchWhole(c, world, 3);
  }
}

// ZeRO 1 and 2 step each owned piece in place in the whole buffer (stepPieces): with groups, the
// rank's pieces together give the whole step's values.
TEST(ShardOptimizer, GroupedPiecesInTheWholeBufferStepAsTheWholeBuffer) {
  for (const Case& c : kGroupedCases) {
    for (int world : {1, 2, 3, 5}) {
      SCOPED_TRACE(std::string(c.name) + ", world " + std::to_string(world));
      const ShardMap layout(kUnits, {.worldSize = world, .rank = 0});
      const size_t n = layout.numel();
      Tensor whole = tensorOf(randomValues(n, 1)), pieces = whole.clone();
      auto wholeOptimizer = makeOptimizer(c.options, n);
      std::vector<std::unique_ptr<Optimizer>> ranks;
      for (int r = 0; r < world; ++r) {
        ranks.push_back(makeShardOptimizer(c.options, ShardMap(kUnits, {.worldSize = world, .rank = r})));
      }
      for (int step = 0; step < 3; ++step) {
        const Tensor grads = tensorOf(randomValues(n, 70 + static_cast<uint64_t>(step)));
        wholeOptimizer->step(whole, grads);
        for (auto& o : ranks) o->stepPieces({.values = pieces.data(), .grads = grads.data()});
        ASSERT_TRUE(sameBits(valuesOf(pieces), valuesOf(whole))) << "step " << step;
      }
    }
  }
}

TEST(ShardOptimizer, RefusesGroupsPastTheMapsBuffer) {
  const ShardMap map(kUnits, {.worldSize = 2, .rank = 0});
  EXPECT_THROW(makeShardOptimizer({.lr = 0.1f, .groups = {{.begin = 0, .end = map.numel() + 1}}}, map),
               InvalidArgument);
  EXPECT_NO_THROW(makeShardOptimizer({.lr = 0.1f, .groups = {{.begin = 0, .end = map.numel()}}}, map));
}

// On a GPU stepShard updates the whole packed shard in one kernel: that is only right because a
// padding element that is zero in the values and the gradient stays zero. The same arithmetic on
// the CPU (step() over the whole shard) shows it, and gives stepShard's bits.
TEST(ShardOptimizer, TheWholeShardsStepLeavesZeroPaddingZero) {
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.name);
    const ShardMap map(kUnits, {.worldSize = 4, .rank = 3});
    const auto flat = randomValues(map.numel(), 5);
    Tensor a = Tensor::zeros(Shape{static_cast<int64_t>(map.shardNumel())}), b = a.clone(), g = a.clone();
    map.pack(flat.data(), 3, a.data());
    map.pack(flat.data(), 3, b.data());
    auto sharded = makeShardOptimizer(c.options, map), plain = makeShardOptimizer(c.options, map);
    for (int step = 0; step < 3; ++step) {
      const auto grads = randomValues(map.numel(), 50 + static_cast<uint64_t>(step));
      map.pack(grads.data(), 3, g.data());
      sharded->stepShard(a, g);
      plain->step(b, g);
    }
    EXPECT_TRUE(sameBits(valuesOf(a), valuesOf(b)));
  }
}

TEST(ShardOptimizer, RefusesBuffersItWasNotMadeFor) {
  const ShardMap map(kUnits, {.worldSize = 3, .rank = 1});
  auto sharded = makeShardOptimizer({.kind = OptimizerKind::kAdam, .lr = 0.1f}, map);
  EXPECT_TRUE(sharded->sharded());
  EXPECT_EQ(sharded->shardPieces().size(), kUnits.size());
  Tensor wrong = Tensor::zeros(Shape{static_cast<int64_t>(map.shardNumel() + 1)});
  EXPECT_THROW(sharded->stepShard(wrong, wrong), InvalidArgument);
  EXPECT_EQ(sharded->steps(), 0);

  auto plain = makeOptimizer({.kind = OptimizerKind::kAdam, .lr = 0.1f}, map.shardNumel());
  EXPECT_FALSE(plain->sharded());
  Tensor shard = Tensor::zeros(Shape{static_cast<int64_t>(map.shardNumel())});
  EXPECT_THROW(plain->stepShard(shard, shard), InvalidArgument);
  EXPECT_THROW(makeShardOptimizer({.lr = -1.0f}, map), InvalidArgument);

  // A map without units is a shard of nothing, and stepping it only counts the step.
  const ShardMap none({}, {.worldSize = 2, .rank = 0});
  auto empty = makeShardOptimizer({.lr = 0.1f}, none);
  Tensor nothing = Tensor::zeros(Shape{0});
  empty->stepShard(nothing, nothing);
  EXPECT_EQ(empty->steps(), 1);
}

}  // namespace
}  // namespace cohort::nn
