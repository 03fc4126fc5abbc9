// The shared evaluation's chunk sums crossing a float32 reduce (train::splitSums, joinSums), bit for
// bit, built with the project's flags. GCC 12.2 drops the rounding of (double)(float)x where its
// basic-block vectoriser pairs two such values stored side by side (docs/build.md, "Floating point and
// GCC 12"). Trainer::evaluateTest first split each sum into floats that add up to it, in such a loop,
// and lost bits; these tests fail for that split, and would for any split that rounds through float.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "train/evaluate.h"

namespace cohort::train {
namespace {

// Whether a float holds x exactly, read from its bits: no conversion the compiler could drop.
bool floatHolds(double x) {
  const auto bits = std::bit_cast<uint64_t>(x);
  if ((bits << 1) == 0) return true;  // +-0
  const int exponent = static_cast<int>((bits >> 52) & 0x7ff) - 1023;
  return exponent >= -126 && exponent <= 127 && (bits & ((uint64_t{1} << 29) - 1)) == 0;
}

// A reduce through float32 (ReplicaPlacement::reduce's, before Job::reduce became one reduce of raw
// doubles): every rank's values rounded to float and added in float. The sum goes through memory
// (volatile), as it does through a communicator's buffers. The split must survive it still: a
// program may reduce the pieces over a communicator of its own.
std::vector<double> reduceThroughFloat32(const std::vector<std::vector<double>>& perRank) {
  std::vector<double> out(perRank.front().size());
  for (size_t i = 0; i < out.size(); ++i) {
    volatile float sum = 0;
    for (const auto& values : perRank) sum = sum + static_cast<float>(values[i]);
    out[i] = sum;
  }
  return out;
}

// Sums as evaluateChunks makes them, with every mantissa bit in use: a float batch loss times the
// batch's size, and a count of correct predictions.
std::vector<double> evaluationSums(size_t chunks) {
  std::vector<double> sums(2 * chunks);
  uint64_t state = 0x9e3779b97f4a7c15ull;
  for (size_t c = 0; c < chunks; ++c) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    const double batchLoss = std::ldexp(static_cast<double>(state >> 40), -22);  // [0, 4): 24 bits
    const double size = static_cast<double>(997 + (state >> 20) % 64);
    sums[2 * c] = batchLoss * size + std::ldexp(static_cast<double>(state >> 11), -60);  // 53 bits
    sums[2 * c + 1] = static_cast<double>((state >> 8) % 1000);
  }
  return sums;
}

bool sameBits(double a, double b) { return std::bit_cast<uint64_t>(a) == std::bit_cast<uint64_t>(b); }

// What Trainer::evaluateTest does on `ranks` ranks, each splitting its chunks' sums into its own
// pieces (zeros elsewhere), then the float32 reduce and the join on rank 0.
std::vector<double> sharedOverRanks(const std::vector<double>& sums, int ranks) {
  const size_t chunks = sums.size() / 2;
  std::vector<std::vector<double>> pieces(static_cast<size_t>(ranks),
                                          std::vector<double>(kPiecesPerSum * sums.size(), 0.0));
  for (int rank = 0; rank < ranks; ++rank) {
    const size_t first = chunks * static_cast<size_t>(rank) / static_cast<size_t>(ranks);
    const size_t last = chunks * static_cast<size_t>(rank + 1) / static_cast<size_t>(ranks);
    const size_t mine = 2 * first, count = 2 * (last - first);
    splitSums(
        std::span<const double>(sums).subspan(mine, count),
        std::span<double>(pieces[static_cast<size_t>(rank)]).subspan(kPiecesPerSum * mine, kPiecesPerSum * count));
  }
  std::vector<double> joined(sums.size());
  joinSums(reduceThroughFloat32(pieces), joined);
  return joined;
}

TEST(FloatRoundingTest, EveryPieceIsHeldExactlyByAFloat) {
  for (size_t chunks : {1, 3, 7, 50}) {
    const std::vector<double> sums = evaluationSums(chunks);
    std::vector<double> pieces(kPiecesPerSum * sums.size());
    splitSums(sums, pieces);
    for (size_t i = 0; i < pieces.size(); ++i) {
      EXPECT_TRUE(floatHolds(pieces[i])) << "piece " << i % kPiecesPerSum << " of sum " << i / kPiecesPerSum << " of "
                                         << sums.size() << ": " << std::hexfloat << pieces[i] << " (sum "
                                         << sums[i / kPiecesPerSum] << ")";
    }
  }
}

TEST(FloatRoundingTest, EvaluationSumsCrossAFloat32ReduceBitForBit) {
  for (size_t chunks : {0, 1, 2, 6, 7, 1001}) {
    const std::vector<double> sums = evaluationSums(chunks);
    for (int ranks : {1, 2, 3, 4, 7}) {
      const std::vector<double> joined = sharedOverRanks(sums, ranks);
      int wrong = 0;
      for (size_t i = 0; i < sums.size(); ++i) {
        if (sameBits(joined[i], sums[i])) continue;
        if (++wrong <= 3) {
          ADD_FAILURE() << chunks << " chunks over " << ranks << " ranks: sum " << i << " is " << std::hexfloat
                        << joined[i] << ", was " << sums[i];
        }
      }
      EXPECT_EQ(wrong, 0) << chunks << " chunks over " << ranks << " ranks";
    }
  }
}

// The doubles no float split carries: outside float's range, subnormal, signed zero, NaN's payload.
TEST(FloatRoundingTest, AnyDoubleCrossesBitForBit) {
  using Limits = std::numeric_limits<double>;
  const std::vector<double> sums = {0.0,
                                    -0.0,
                                    Limits::denorm_min(),
                                    -Limits::min(),
                                    Limits::max(),
                                    Limits::lowest(),
                                    Limits::infinity(),
                                    -Limits::infinity(),
                                    std::bit_cast<double>(0x7ff4000000000123ull),
                                    1e-300,
                                    0.1,
                                    1.0 / 3.0};
  for (int ranks : {1, 2, 3}) {
    const std::vector<double> joined = sharedOverRanks(sums, ranks);
    for (size_t i = 0; i < sums.size(); ++i) {
      EXPECT_TRUE(sameBits(joined[i], sums[i]))
          << ranks << " ranks: " << std::hexfloat << sums[i] << " came back as " << joined[i];
    }
  }
}

}  // namespace
}  // namespace cohort::train
