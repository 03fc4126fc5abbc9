// zeroStateBytes: ZeRO's per-rank figures (train/zero_memory.h) against hand-computed bytes for a
// model of five units, at every stage, for AdamW, SGD with and without momentum, one rank and bf16
// (its message buffers); the shard it counts against nn::ShardMap's; the placement's peak on the
// CPU and on a GPU; and the shard group of each scope.
#include "train/zero_memory.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "nn/shard_map.h"
#include "runtime/error.h"

namespace cohort::train {
namespace {

// N = 37 floats in units of 10, 7, 3, 16 and 1. On W = 4: the packed shard is 3 + 2 + 1 + 4 + 1 =
// 11 floats; the padded units (all but 16) stage 12 + 8 + 4 + 4 = 28 floats; the three largest
// units padded are 16 + 12 + 8 = 36 floats, the two largest 16 + 12 = 28.
const std::vector<size_t> kUnits = {10, 7, 3, 16, 1};
const nn::OptimizerOptions kAdamW = {.kind = nn::OptimizerKind::kAdamW};

void expectBytes(const StateBytes& b, size_t params, size_t grads, size_t optimizer, size_t staging,
                 const std::string& what) {
  EXPECT_EQ(b.params, params) << what;
  EXPECT_EQ(b.grads, grads) << what;
  EXPECT_EQ(b.optimizer, optimizer) << what;
  EXPECT_EQ(b.staging, staging) << what;
}

TEST(ZeroMemoryTest, EveryStageOfAdamWOnFourRanks) {
  auto at = [](int stage) {
    return zeroStateBytes({.units = kUnits, .stage = stage, .groupSize = 4, .optimizer = kAdamW});
  };
  expectBytes(at(0), 148, 148, 296, 0, "stage 0: 4N, 4N, 8N");
  expectBytes(at(1), 148, 148, 88, 112, "stage 1: 4N, 4N, 8·11, the padded units' 28 floats");
  expectBytes(at(2), 148, 44, 88, 112 + 144, "stage 2: 4N, 4·11, 8·11, padded units and 3 gradient windows");
  expectBytes(at(3), 44, 44, 88, 144 + 112, "stage 3: 4·11 each, 3 gradient and 2 parameter windows");
}

// The placement's peak, N = 148 bytes, the shard 44, AdamW's shard 88: on the CPU the whole
// parameters and their copy in the communicator's memory (stages 1, 2), or the whole parameters the
// initialisation fills and the parameter shard (3); on a GPU the whole parameters and gradients
// moved to the device, and the shards made from them beside them (2: the gradients', 3: both).
TEST(ZeroMemoryTest, ThePlacementsPeak) {
  auto peak = [](int stage, bool onGpu) {
    return zeroPlacementPeakBytes({.units = kUnits, .stage = stage, .groupSize = 4, .optimizer = kAdamW, .onGpu = onGpu});
  };
  EXPECT_EQ(peak(0, false), 592u);
  EXPECT_EQ(peak(1, false), 2 * 148u + 88);
  EXPECT_EQ(peak(2, false), 2 * 148u + 88);
  EXPECT_EQ(peak(3, false), 148u + 44 + 88);
  EXPECT_EQ(peak(0, true), 592u);
  EXPECT_EQ(peak(1, true), 2 * 148u + 88);
  EXPECT_EQ(peak(2, true), 2 * 148u + 88 + 44);
  EXPECT_EQ(peak(3, true), 2 * 148u + 88 + 44 + 44);
}

TEST(ZeroMemoryTest, TheOptimizersState) {
  auto stage1 = [](nn::OptimizerOptions o) {
    return zeroStateBytes({.units = kUnits, .stage = 1, .groupSize = 4, .optimizer = o}).optimizer;
  };
  EXPECT_EQ(stage1({.kind = nn::OptimizerKind::kAdam}), 88u);
  EXPECT_EQ(stage1({.kind = nn::OptimizerKind::kSgd, .momentum = 0.9f}), 44u);
  EXPECT_EQ(stage1({.kind = nn::OptimizerKind::kSgd}), 0u);
  EXPECT_EQ(zeroStateBytes({.units = kUnits, .stage = 0, .optimizer = {.kind = nn::OptimizerKind::kSgd}}).total(),
            296u);
}

// One rank shards nothing and pads nothing; stage 3's windows are still the largest units whole:
// 16 + 10 + 7 and 16 + 10 floats.
TEST(ZeroMemoryTest, OneRank) {
  expectBytes(zeroStateBytes({.units = kUnits, .stage = 1, .groupSize = 1, .optimizer = kAdamW}), 148, 148, 296, 0,
              "stage 1 on 1 rank");
  expectBytes(zeroStateBytes({.units = kUnits, .stage = 3, .groupSize = 1, .optimizer = kAdamW}), 148, 148, 296,
              132 + 104, "stage 3 on 1 rank");
}

TEST(ZeroMemoryTest, Bf16KeepsFp32State) {
  for (int stage = 0; stage <= 3; ++stage) {
    const StateBytes fp32 = zeroStateBytes({.units = kUnits, .stage = stage, .groupSize = 3, .optimizer = kAdamW});
    const StateBytes bf16 = zeroStateBytes(
        {.units = kUnits, .stage = stage, .groupSize = 3, .optimizer = kAdamW, .precision = runtime::DType::kBF16});
    expectBytes(bf16, fp32.params, fp32.grads, fp32.optimizer, fp32.staging, "stage " + std::to_string(stage));
  }
}

// bf16 gathers: units 10, 3 and 16 sent as messages of 6, 2 and 5 words per rank (4 ranks: 12, 4
// and 10 floats of message buffer). Stage 1 holds the two largest (22 floats) beside every padded
// unit's staging (its reduce-scatters); stage 2 holds them in its gradient windows (36 floats, free
// by then) and stages no padded unit sent as a message (10 and 3: only 7 and 1, 8 + 4 floats); stage
// 3 holds one message (12 floats) beside its windows. fp32 ignores the words.
TEST(ZeroMemoryTest, Bf16CountsTheMessageBuffers) {
  const std::vector<size_t> words = {6, 0, 2, 5, 0};
  auto at = [&](int stage, runtime::DType precision) {
    return zeroStateBytes({.units = kUnits,
                           .stage = stage,
                           .groupSize = 4,
                           .optimizer = kAdamW,
                           .precision = precision,
                           .gatherWords = words});
  };
  const auto bf16 = runtime::DType::kBF16;
  expectBytes(at(0, bf16), 148, 148, 296, 0, "stage 0 gathers nothing");
  expectBytes(at(1, bf16), 148, 148, 88, 112 + 88, "stage 1: padded units' 28 floats, messages of 12 + 10");
  expectBytes(at(2, bf16), 148, 44, 88, 48 + 144, "stage 2: 7 and 1 staged, 3 gradient windows holding 2 messages");
  expectBytes(at(3, bf16), 44, 44, 88, 144 + 112 + 48, "stage 3: the windows and one message of 12 floats");
  for (int stage = 0; stage <= 3; ++stage) {
    const StateBytes fp32 = zeroStateBytes({.units = kUnits, .stage = stage, .groupSize = 4, .optimizer = kAdamW});
    EXPECT_EQ(at(stage, runtime::DType::kF32).staging, fp32.staging) << "stage " << stage;
  }
  EXPECT_THROW(zeroStateBytes({.units = kUnits,
                               .stage = 2,
                               .groupSize = 4,
                               .precision = bf16,
                               .gatherWords = {1, 2}}),
               InvalidArgument);
}

// The shard counted is the one the placement allocates: nn::ShardMap's shardNumel(), on 1 to 5 ranks.
TEST(ZeroMemoryTest, TheShardIsTheShardMaps) {
  std::vector<nn::ShardMap::Unit> units;
  for (size_t u = 0; u < kUnits.size(); ++u) units.push_back({.name = "u" + std::to_string(u), .numel = kUnits[u]});
  for (int w = 1; w <= 5; ++w) {
    const nn::ShardMap map(units, {.worldSize = w});
    const StateBytes b = zeroStateBytes({.units = kUnits, .stage = 2, .groupSize = w, .optimizer = kAdamW});
    EXPECT_EQ(b.grads, map.shardNumel() * sizeof(float)) << w << " ranks";
    EXPECT_EQ(b.optimizer, 2 * map.shardNumel() * sizeof(float)) << w << " ranks";
  }
}

// Units that W divides, large next to the windows: the figures are ZeRO's Figure 1 plus the
// windows alone. N = 8·4096, W = 4: stage 2 is 4N + 12N/W = 229376 bytes, and 3 windows of 4096 floats.
TEST(ZeroMemoryTest, FigureOneWhereWDividesEveryUnit) {
  const std::vector<size_t> units(8, 4096);
  const double n = 8 * 4096;
  const StateBytes b = zeroStateBytes({.units = units, .stage = 2, .groupSize = 4, .optimizer = kAdamW});
  EXPECT_EQ(static_cast<double>(b.params + b.grads + b.optimizer), 4 * n + 12 * n / 4);
  EXPECT_EQ(b.staging, 3 * 4096 * sizeof(float));
  const StateBytes s3 = zeroStateBytes({.units = units, .stage = 3, .groupSize = 4, .optimizer = kAdamW});
  EXPECT_EQ(static_cast<double>(s3.params + s3.grads + s3.optimizer), 16 * n / 4);
}

TEST(ZeroMemoryTest, RefusesWhatDoesNotExist) {
  EXPECT_THROW(zeroStateBytes({.units = kUnits, .stage = 4}), InvalidArgument);
  EXPECT_THROW(zeroStateBytes({.units = kUnits, .stage = -1}), InvalidArgument);
  EXPECT_THROW(zeroStateBytes({.units = kUnits, .stage = 1, .groupSize = 0}), InvalidArgument);
}

TEST(ZeroMemoryTest, TheShardGroupOfEachScope) {
  const runtime::WorldInfo world{.rank = 5, .worldSize = 8, .localRank = 1, .localWorldSize = 4, .jobId = "t"};
  EXPECT_EQ(shardGroupSize(world, ZeroScope::kJob), 8);
  EXPECT_EQ(shardGroupSize(world, ZeroScope::kNode), 4);
}

}  // namespace
}  // namespace cohort::train
