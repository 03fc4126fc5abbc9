#include "train/placement/shard_sync.h"

#include <algorithm>
#include <cstring>

#include "runtime/error.h"

namespace cohort::train {

namespace {

using collectives::ReduceOp;

size_t paddedNumel(const nn::ShardMap& map, size_t u) {
  return map.pieceNumel(u) * static_cast<size_t>(map.worldSize());
}

}  // namespace

ShardSync::ShardSync(collectives::Communicator& shard, const nn::ShardMap& map, const nn::ParamBuffer& params,
                     const ShardSyncOptions& options)
    : shard_(shard), map_(map), params_(params), options_(options), units_(map.units()) {
  COHORT_CHECK(map.worldSize() == shard.size() && map.rank() == shard.rank())
      << "a shard map of " << map.worldSize() << " ranks over a communicator of " << shard.size();
  COHORT_CHECK(map.numel() == params.numel()) << "a shard map of " << map.numel() << " elements for "
                                              << params.numel();
  for (size_t u = 0; u < map.units(); ++u) {
    unitOfOffset_[map.unitOffset(u)] = u;
    if (map.unit(u).numel < paddedNumel(map, u)) {
      units_[u].padded = true;
      units_[u].staging.assign(paddedNumel(map, u), 0.0f);
    }
  }
}

size_t ShardSync::stagingBytes() const {
  size_t floats = 0;
  for (const UnitState& s : units_) floats += s.staging.size();
  return floats * sizeof(float);
}

size_t ShardSync::unitAt(size_t flatOffset) const {
  const auto it = unitOfOffset_.find(flatOffset);
  COHORT_CHECK(it != unitOfOffset_.end()) << "no parameter unit starts at element " << flatOffset;
  return it->second;
}

void ShardSync::afterBackward(const nn::ParamBuffer::Unit& unit) {
  const size_t u = unitAt(unit.offset);
  COHORT_CHECK(!units_[u].started) << "unit " << unit.name << " reported twice in one backward";
  start(u);
}

// The unit's reduce-scatter (average): in place in the flat gradient buffer, or through its staging.
void ShardSync::start(size_t u) {
  UnitState& s = units_[u];
  const size_t n = map_.unit(u).numel, piece = map_.pieceNumel(u);
  const size_t at = map_.unitOffset(u);
  float* grads = params_.grads().data() + at;
  const ReduceOp avg = ReduceOp::kAvg;
  if (s.padded) {
    std::memcpy(s.staging.data(), grads, n * sizeof(float));
    std::fill(s.staging.begin() + static_cast<std::ptrdiff_t>(n), s.staging.end(), 0.0f);
    float* out = s.staging.data() + static_cast<size_t>(map_.rank()) * piece;
    s.work = shard_.reduceScatter(s.staging.data(), out, piece, {.op = avg});
  } else {
    float* out = grads + static_cast<size_t>(map_.rank()) * piece;
    s.work = shard_.reduceScatter(grads, out, piece, {.op = avg});
  }
  s.started = true;
  ++reduceScatters_;
}

// Waits for the unit's reduce-scatter and copies a staged piece's real part to its flat place.
void ShardSync::waitAndPlace(size_t u) {
  UnitState& s = units_[u];
  s.work->wait(options_.timeout);
  s.work.reset();
  s.started = false;
  const nn::ShardMap::Piece p = map_.piece(u, map_.rank());
  if (s.padded && p.realNumel() > 0) {
    std::memcpy(params_.grads().data() + p.flatBegin, s.staging.data() + p.inUnit, p.realNumel() * sizeof(float));
  }
}

void ShardSync::finishGradients() {
  for (size_t u = 0; u < units_.size(); ++u) {
    if (!units_[u].started) start(u);
  }
  for (size_t u = 0; u < units_.size(); ++u) waitAndPlace(u);
  if (!options_.cross || options_.cross->size() == 1) return;
  // Scope node: every node's same piece, averaged across the nodes (its real elements only).
  std::vector<collectives::WorkPtr> work;
  for (size_t u = 0; u < units_.size(); ++u) {
    const nn::ShardMap::Piece p = map_.piece(u, map_.rank());
    if (p.realNumel() == 0) continue;
    float* mine = params_.grads().data() + p.flatBegin;
    work.push_back(options_.cross->allReduce(mine, mine, p.realNumel(), {.op = ReduceOp::kAvg}));
  }
  for (auto& w : work) w->wait(options_.timeout);
}

void ShardSync::gatherParams() {
  float* values = params_.values().data();
  std::vector<collectives::WorkPtr> work(units_.size());
  for (size_t u = 0; u < units_.size(); ++u) {
    const size_t piece = map_.pieceNumel(u);
    const nn::ShardMap::Piece p = map_.piece(u, map_.rank());
    float* unit = values + map_.unitOffset(u);
    UnitState& s = units_[u];
    if (!s.padded) {
      work[u] = shard_.allGather(unit + p.inUnit, unit, piece, {});
      continue;
    }
    float* mine = s.staging.data() + p.inUnit;
    std::memcpy(mine, values + p.flatBegin, p.realNumel() * sizeof(float));
    std::fill(mine + p.realNumel(), mine + piece, 0.0f);
    work[u] = shard_.allGather(mine, s.staging.data(), piece, {});
  }
  for (size_t u = 0; u < units_.size(); ++u) {
    work[u]->wait(options_.timeout);
    if (units_[u].padded) {
      std::memcpy(values + map_.unitOffset(u), units_[u].staging.data(), map_.unit(u).numel * sizeof(float));
    }
  }
}

void ShardSync::gatherShard(const float* shard, float* flat) {
  std::vector<float> unit;
  for (size_t u = 0; u < units_.size(); ++u) {
    const size_t piece = map_.pieceNumel(u);
    unit.resize(paddedNumel(map_, u));
    shard_.allGather(shard + map_.shardOffset(u), unit.data(), piece, {})->wait(options_.timeout);
    std::memcpy(flat + map_.unitOffset(u), unit.data(), map_.unit(u).numel * sizeof(float));
  }
}

}  // namespace cohort::train
