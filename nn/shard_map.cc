#include "nn/shard_map.h"

#include <algorithm>
#include <limits>
#include <set>

#include "nn/param_buffer.h"
#include "runtime/error.h"

namespace cohort::nn {

ShardMap::ShardMap(std::vector<Unit> units, const Options& options)
    : units_(std::move(units)), worldSize_(options.worldSize), rank_(options.rank) {
  if (worldSize_ < 1)
    COHORT_THROW(InvalidArgument) << "a shard map needs a world size of at least 1, got " << worldSize_;
  checkRank(rank_);
  const size_t world = static_cast<size_t>(worldSize_);
  const size_t limit = std::numeric_limits<size_t>::max() / 2;
  std::set<std::string> names;
  layout_.reserve(units_.size());
  for (const Unit& unit : units_) {
    if (unit.name.empty()) COHORT_THROW(InvalidArgument) << "unit " << layout_.size() << " of a shard map has no name";
    if (!names.insert(unit.name).second)
      COHORT_THROW(InvalidArgument) << "two units of a shard map are named '" << unit.name << "'";
    const size_t piece = unit.numel / world + (unit.numel % world != 0 ? 1 : 0);
    if (unit.numel > limit - numel_ || piece > (limit - shardNumel_) / world) {
      COHORT_THROW(InvalidArgument) << "unit '" << unit.name << "' of " << unit.numel
                                    << " elements makes the shard map's sizes overflow";
    }
    layout_.push_back({.flatOffset = numel_, .pieceNumel = piece, .shardOffset = shardNumel_});
    numel_ += unit.numel;
    shardNumel_ += piece;
  }
}

void ShardMap::checkRank(int rank) const {
  if (rank < 0 || rank >= worldSize_) {
    COHORT_THROW(InvalidArgument) << "rank " << rank << " is outside a shard map of world size " << worldSize_;
  }
}

ShardMap::Piece ShardMap::piece(size_t u, int rank) const {
  checkRank(rank);
  if (u >= units_.size()) COHORT_THROW(InvalidArgument) << "unit " << u << " of a shard map of " << units_.size();
  const Layout& l = layout_[u];
  const size_t inUnit = static_cast<size_t>(rank) * l.pieceNumel;
  const size_t realBegin = std::min(inUnit, units_[u].numel);
  const size_t realEnd = std::min(inUnit + l.pieceNumel, units_[u].numel);
  return {.unit = u,
          .inUnit = inUnit,
          .numel = l.pieceNumel,
          .flatBegin = l.flatOffset + realBegin,
          .flatEnd = l.flatOffset + realEnd,
          .shardOffset = l.shardOffset};
}

std::vector<ShardMap::Piece> ShardMap::pieces(int rank) const {
  std::vector<Piece> all;
  all.reserve(units_.size());
  for (size_t u = 0; u < units_.size(); ++u) all.push_back(piece(u, rank));
  return all;
}

size_t ShardMap::ownedNumel(int rank) const {
  size_t n = 0;
  for (size_t u = 0; u < units_.size(); ++u) n += piece(u, rank).realNumel();
  return n;
}

void ShardMap::pack(const float* flat, int rank, float* shard) const {
  for (const Piece& p : pieces(rank)) {
    std::copy(flat + p.flatBegin, flat + p.flatEnd, shard + p.shardOffset);
    std::fill(shard + p.shardOffset + p.realNumel(), shard + p.shardOffset + p.numel, 0.0f);
  }
}

void ShardMap::unpack(const float* shard, int rank, float* flat) const {
  for (const Piece& p : pieces(rank))
    std::copy(shard + p.shardOffset, shard + p.shardOffset + p.realNumel(), flat + p.flatBegin);
}

ShardMap shardMapOf(const ParamBuffer& params, const ShardMap::Options& options) {
  std::vector<ShardMap::Unit> units;
  size_t offset = 0;
  for (const ParamBuffer::Unit& u : params.units()) {
    COHORT_CHECK(u.offset == offset) << "unit " << u.name << " starts at " << u.offset << ", not " << offset;
    units.push_back({.name = u.name, .numel = u.numel});
    offset += u.numel;
  }
  COHORT_CHECK(offset == params.numel()) << "the units cover " << offset << " of " << params.numel() << " elements";
  return ShardMap(std::move(units), options);
}

}  // namespace cohort::nn
