// ShardMap: which piece of each parameter unit every rank of a sharded job owns (ZeRO-3 / FSDP2's
// flat-parameter sharding; docs/architecture.md, "The shard map and piecewise initialisation").
//
// The units are consecutive ranges of the flat parameter buffer, in order, starting at element 0
// (a transformer block, a top-level layer of a Sequential, ...; the buffer's alignment padding
// between parameters belongs to the unit it precedes, as in nn::ParamBuffer's units). Each unit of n elements is padded
// to a multiple of the world size W, padded = ceil(n / W) · W, and cut into W equal pieces of
// pieceNumel = padded / W elements; rank r owns piece r: elements [r · pieceNumel, (r + 1) ·
// pieceNumel) of the padded unit. Only its first elements may be real: the tail of the unit's
// last pieces is padding (with W > n some ranks own padding only; a unit of 0 elements has pieces
// of 0). A rank keeps its pieces one after the other in its packed shard buffer, unit by unit, so
// every rank's shard has the same size, shardNumel(), and the piece of unit u starts at the same
// offset, shardOffset(u), on every rank: a reduce-scatter or all-gather per unit works on equal
// chunks, and the unit's padded buffer is the W pieces in rank order.
//
// Value type; immutable after construction; any thread may read it. Built from a plain list of unit
// sizes, or from a model's ParamBuffer (shardMapOf: its units, which tile its flat buffer).
//
//   nn::ShardMap map({{"wte", 3200}, {"h.0", 12608}, {"ln_f", 64}}, {.worldSize = 3, .rank = 1});
//   for (size_t u = 0; u < map.units(); ++u) {
//     const nn::ShardMap::Piece p = map.piece(u, map.rank());  // p.flatBegin..p.flatEnd -> shard[p.shardOffset..]
//   }
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace cohort::nn {

class ParamBuffer;

class ShardMap {
 public:
  struct Unit {
    std::string name = {};
    size_t numel = 0;  // real elements, without padding
  };
  struct Options {
    int worldSize = 1;
    int rank = 0;  // the rank this map is for (rank()); piece() answers for any rank
  };
  // One rank's piece of one unit.
  struct Piece {
    size_t unit = 0;
    size_t inUnit = 0;       // where the piece starts in the padded unit: rank · pieceNumel
    size_t numel = 0;        // pieceNumel(unit): real elements and padding
    size_t flatBegin = 0;    // its real elements in the flat parameter buffer: [flatBegin, flatEnd),
    size_t flatEnd = 0;      // empty when the piece is all padding
    size_t shardOffset = 0;  // where it starts in the rank's packed shard buffer
    size_t realNumel() const { return flatEnd - flatBegin; }
  };

  // Throws InvalidArgument for a world size below 1, a rank outside [0, worldSize), a unit without
  // a name, two units with one name, or sizes whose padded sum would overflow.
  ShardMap(std::vector<Unit> units, const Options& options);

  int worldSize() const { return worldSize_; }
  int rank() const { return rank_; }
  size_t units() const { return units_.size(); }
  const Unit& unit(size_t u) const { return units_.at(u); }
  size_t unitOffset(size_t u) const { return layout_.at(u).flatOffset; }    // in the flat buffer
  size_t pieceNumel(size_t u) const { return layout_.at(u).pieceNumel; }    // ceil(numel / worldSize)
  size_t shardOffset(size_t u) const { return layout_.at(u).shardOffset; }  // the same on every rank

  // Rank `rank`'s piece of unit `u`; throws InvalidArgument for a rank or unit out of range.
  Piece piece(size_t u, int rank) const;
  std::vector<Piece> pieces(int rank) const;  // every unit's, in order

  size_t numel() const { return numel_; }            // real elements of all units: the flat buffer
  size_t shardNumel() const { return shardNumel_; }  // a packed shard, padding included (every rank)
  size_t ownedNumel(int rank) const;                 // the real elements rank `rank` owns

  // Copies rank `rank`'s real elements from a flat buffer (numel() floats) into its packed shard
  // (shardNumel() floats), writing zeros into the padding; and back. For tests and for converting
  // whole-model buffers; sharded training never holds a flat buffer of the whole model.
  void pack(const float* flat, int rank, float* shard) const;
  void unpack(const float* shard, int rank, float* flat) const;

 private:
  struct Layout {
    size_t flatOffset = 0, pieceNumel = 0, shardOffset = 0;
  };
  void checkRank(int rank) const;

  std::vector<Unit> units_;
  std::vector<Layout> layout_;
  int worldSize_ = 1;
  int rank_ = 0;
  size_t numel_ = 0;
  size_t shardNumel_ = 0;
};

// The map of `params`' units (ParamBuffer::units(): a GPT's embeddings, blocks and final LayerNorm,
// a Sequential's top-level layers, the user's declared groups), in order; they tile its flat buffer,
// alignment padding included, so the map's numel() is params.numel().
ShardMap shardMapOf(const ParamBuffer& params, const ShardMap::Options& options);

}  // namespace cohort::nn
