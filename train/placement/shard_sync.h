// ShardSync: the collectives of sharded data parallel (ZeRO 1 and 2) over an nn::ShardMap of the
// model's parameter units (docs/sharding.md): each unit's gradient is reduce-scattered (averaged)
// as backward reports the unit final, so that this rank ends with the average of its pieces only,
// and after the update each unit's parameters are all-gathered from the ranks' updated pieces.
//
// A unit of n elements at flat offset o is cut into W pieces of P elements (the map: P = ceil(n/W)).
// Where n = P·W (no padding) the collectives work in place in the flat buffers, in NCCL's in-place
// layout: the reduce-scatter's input is the unit's slice [o, o + n) and its output this rank's piece
// [o + r·P, o + (r + 1)·P) of it; the all-gather's input is that piece and its output the slice.
// Where the unit is padded (n < P·W) the unit goes through a staging buffer of P·W elements of its
// own (zeroed padding), and the real part of the result is copied where it belongs. Either way this
// rank's averaged gradient piece, and its updated parameter piece, live at the piece's place in the
// flat buffers (ShardMap::Piece::flatBegin..flatEnd): the optimizer steps them there
// (nn::Optimizer::stepPieces).
// Scope node (PyTorch's HYBRID_SHARD): the map and `shard` span this node's ranks; `cross` joins this
// local rank of every node, over which each averaged piece is averaged again (every node holds the
// same shards, replicated), after its reduce-scatter.
// Order: every rank builds the same map and issues the same collectives in the same order (units
// in the order backward reports them, then the unreported ones in map order), which the
// communicators' fingerprints check. Every wait is bounded by the timeout.
// Ownership: borrows the communicators, the map and the ParamBuffer (CPU buffers). Thread safety:
// the training thread only.
#pragma once

#include <chrono>
#include <map>
#include <vector>

#include "collectives/communicator.h"
#include "nn/module.h"
#include "nn/param_buffer.h"
#include "nn/shard_map.h"
#include "train/observe/timeline.h"

namespace cohort::train {

struct ShardSyncOptions {
  collectives::Communicator* cross = nullptr;  // scope node across nodes; nullptr: none
  std::chrono::milliseconds timeout{std::chrono::seconds(300)};
  Timeline* timeline = nullptr;
};

class ShardSync final : public nn::UnitListener {
 public:
  ShardSync(collectives::Communicator& shard, const nn::ShardMap& map, const nn::ParamBuffer& params,
            const ShardSyncOptions& options);

  // The unit's gradient is final: starts its reduce-scatter. A unit reported twice in one step is
  // a broken model (COHORT_CHECK).
  void afterBackward(const nn::ParamBuffer::Unit& unit) override;
  // Starts the reduce-scatters nobody reported, waits for all of them, averages the pieces across
  // nodes (scope node) and readies the next step. This rank's averaged pieces are then in the flat
  // gradient buffer at their places.
  void finishGradients();
  // All-gathers every unit's parameters from the ranks' pieces (after the update), and waits.
  void gatherParams();
  // All-gathers rank-packed `shard` (map.shardNumel() floats) into the flat buffer `flat` (the map's
  // numel()), e.g. an optimizer state for a checkpoint; waits.
  void gatherShard(const float* shard, float* flat);

  // The padded units' staging buffers.
  size_t stagingBytes() const;
  // Reduce-scatters issued so far.
  uint64_t reduceScatters() const { return reduceScatters_; }

 private:
  struct UnitState {
    bool padded = false;
    std::vector<float> staging;  // padded units: P·W elements
    collectives::WorkPtr work;
    bool started = false;
  };
  void start(size_t unit);
  void waitAndPlace(size_t unit);
  size_t unitAt(size_t flatOffset) const;

  collectives::Communicator& shard_;
  const nn::ShardMap& map_;
  const nn::ParamBuffer& params_;
  ShardSyncOptions options_;
  std::vector<UnitState> units_;
  std::map<size_t, size_t> unitOfOffset_;  // a unit's flat offset -> its index in the map
  uint64_t reduceScatters_ = 0;
};

}  // namespace cohort::train
