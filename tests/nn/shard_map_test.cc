// ShardMap: the pieces of every rank tile each unit exactly, padded equal, for many unit lists and
// world sizes (1..9, units of 0 elements, units smaller than the world), and bad input is refused.
#include "nn/shard_map.h"

#include <gtest/gtest.h>

#include <limits>
#include <vector>

#include "runtime/error.h"

namespace cohort::nn {
namespace {

std::vector<ShardMap::Unit> unitsOf(const std::vector<size_t>& sizes) {
  std::vector<ShardMap::Unit> units;
  for (size_t i = 0; i < sizes.size(); ++i) {
    std::string name = "u";
    units.push_back({name += std::to_string(i), sizes[i]});
  }
  return units;
}

TEST(ShardMap, RangesOfFourRanks) {
  // Units of 10, 0, 3 and 7 elements over 4 ranks: pieces of 3, 0, 1 and 2.
  const ShardMap map(unitsOf({10, 0, 3, 7}), {.worldSize = 4, .rank = 3});
  EXPECT_EQ(map.numel(), 20u);
  EXPECT_EQ(map.shardNumel(), 6u);
  EXPECT_EQ(map.pieceNumel(0), 3u);
  EXPECT_EQ(map.pieceNumel(1), 0u);
  EXPECT_EQ(map.pieceNumel(3), 2u);
  EXPECT_EQ(map.shardOffset(2), 3u);
  EXPECT_EQ(map.shardOffset(3), 4u);
  EXPECT_EQ(map.unitOffset(3), 13u);

  const ShardMap::Piece a = map.piece(0, 3);  // [9, 12) of the padded unit: element 9 and 2 of padding
  EXPECT_EQ(a.inUnit, 9u);
  EXPECT_EQ(a.numel, 3u);
  EXPECT_EQ(a.flatBegin, 9u);
  EXPECT_EQ(a.flatEnd, 10u);
  EXPECT_EQ(a.shardOffset, 0u);
  const ShardMap::Piece c = map.piece(2, 3);  // [3, 4) of a unit of 3: padding only
  EXPECT_EQ(c.realNumel(), 0u);
  EXPECT_EQ(c.shardOffset, 3u);
  const ShardMap::Piece d = map.piece(3, 1);  // [2, 4) of unit 3, which starts at 13
  EXPECT_EQ(d.flatBegin, 15u);
  EXPECT_EQ(d.flatEnd, 17u);
  EXPECT_EQ(d.shardOffset, 4u);
  EXPECT_EQ(map.ownedNumel(0), 3u + 1u + 2u);
  EXPECT_EQ(map.ownedNumel(3), 1u + 0u + 1u);
}

// The invariants for one map: per unit, the ranks' pieces in rank order are the padded unit cut
// into equal pieces, their real parts tile the unit's flat range, the padding is less than one
// element per rank, and every rank's pieces sit at the same offsets of equal shards.
void expectTiling(const ShardMap& map) {
  const size_t world = static_cast<size_t>(map.worldSize());
  size_t flat = 0, shard = 0, owned = 0;
  for (size_t u = 0; u < map.units(); ++u) {
    const size_t n = map.unit(u).numel, piece = map.pieceNumel(u);
    EXPECT_GE(piece * world, n);
    EXPECT_LT(piece * world, n + world);  // the least padding that makes the pieces equal
    EXPECT_EQ(map.unitOffset(u), flat);
    EXPECT_EQ(map.shardOffset(u), shard);
    size_t next = flat;
    for (int r = 0; r < map.worldSize(); ++r) {
      const ShardMap::Piece p = map.piece(u, r);
      EXPECT_EQ(p.unit, u);
      EXPECT_EQ(p.numel, piece);
      EXPECT_EQ(p.inUnit, static_cast<size_t>(r) * piece);
      EXPECT_EQ(p.shardOffset, shard);
      EXPECT_EQ(p.flatBegin, next) << "unit " << u << " rank " << r;
      EXPECT_LE(p.flatBegin, p.flatEnd);
      EXPECT_LE(p.realNumel(), piece);
      // Only the tail of the unit is padding: a piece with padding is followed by padding only.
      if (p.realNumel() < piece) EXPECT_EQ(p.flatEnd, flat + n);
      next = p.flatEnd;
      owned += p.realNumel();
    }
    EXPECT_EQ(next, flat + n) << "unit " << u;
    flat += n;
    shard += piece;
  }
  EXPECT_EQ(map.numel(), flat);
  EXPECT_EQ(map.shardNumel(), shard);
  EXPECT_EQ(owned, flat);
  size_t byRank = 0;
  for (int r = 0; r < map.worldSize(); ++r) byRank += map.ownedNumel(r);
  EXPECT_EQ(byRank, flat);
}

TEST(ShardMap, PiecesTileEveryUnitForManyWorldSizes) {
  const std::vector<std::vector<size_t>> lists = {
      {}, {0}, {1}, {0, 0, 0}, {1, 2, 3, 4, 5}, {7}, {8}, {9, 0, 1}, {1000, 3, 0, 17, 64}, {5, 1, 1, 1, 1, 1, 1, 1}};
  for (const auto& sizes : lists) {
    for (int world = 1; world <= 9; ++world) {
      SCOPED_TRACE("world " + std::to_string(world) + ", " + std::to_string(sizes.size()) + " units");
      const ShardMap map(unitsOf(sizes), {.worldSize = world, .rank = world - 1});
      expectTiling(map);
    }
  }
}

TEST(ShardMap, PackAndUnpackRoundTripAndZeroThePadding) {
  const std::vector<size_t> sizes = {10, 0, 3, 7, 1};
  for (int world = 1; world <= 5; ++world) {
    const ShardMap map(unitsOf(sizes), {.worldSize = world, .rank = 0});
    std::vector<float> flat(map.numel()), back(map.numel(), -1.0f);
    for (size_t i = 0; i < flat.size(); ++i) flat[i] = static_cast<float>(i + 1);
    for (int r = 0; r < world; ++r) {
      std::vector<float> shard(map.shardNumel(), -7.0f);
      map.pack(flat.data(), r, shard.data());
      for (const ShardMap::Piece& p : map.pieces(r)) {
        for (size_t i = 0; i < p.numel; ++i) {
          const float want = i < p.realNumel() ? flat[p.flatBegin + i] : 0.0f;
          EXPECT_EQ(shard[p.shardOffset + i], want) << "world " << world << " rank " << r << " unit " << p.unit;
        }
      }
      map.unpack(shard.data(), r, back.data());
    }
    EXPECT_EQ(back, flat) << "world " << world;
  }
}

TEST(ShardMap, RefusesBadInput) {
  EXPECT_THROW(ShardMap(unitsOf({4}), {.worldSize = 0, .rank = 0}), InvalidArgument);
  EXPECT_THROW(ShardMap(unitsOf({4}), {.worldSize = -2, .rank = 0}), InvalidArgument);
  EXPECT_THROW(ShardMap(unitsOf({4}), {.worldSize = 2, .rank = 2}), InvalidArgument);
  EXPECT_THROW(ShardMap(unitsOf({4}), {.worldSize = 2, .rank = -1}), InvalidArgument);
  EXPECT_THROW(ShardMap({{"a", 1}, {"a", 2}}, {.worldSize = 1, .rank = 0}), InvalidArgument);
  EXPECT_THROW(ShardMap({{"", 1}}, {.worldSize = 1, .rank = 0}), InvalidArgument);
  const size_t huge = std::numeric_limits<size_t>::max() - 1;
  EXPECT_THROW(ShardMap(unitsOf({huge}), {.worldSize = 3, .rank = 0}), InvalidArgument);
  EXPECT_THROW(ShardMap(unitsOf({huge / 4, huge / 4, huge / 4}), {.worldSize = 1, .rank = 0}), InvalidArgument);

  const ShardMap map(unitsOf({4, 5}), {.worldSize = 2, .rank = 1});
  EXPECT_THROW(map.piece(2, 0), InvalidArgument);
  EXPECT_THROW(map.piece(0, 2), InvalidArgument);
  EXPECT_THROW(map.ownedNumel(-1), InvalidArgument);
  try {
    ShardMap(unitsOf({4}), {.worldSize = 3, .rank = 3});
    ADD_FAILURE() << "no throw";
  } catch (const InvalidArgument& e) {
    EXPECT_STREQ(e.what(), "rank 3 is outside a shard map of world size 3");
  }
}

}  // namespace
}  // namespace cohort::nn
