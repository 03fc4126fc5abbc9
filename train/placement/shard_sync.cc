#include "train/placement/shard_sync.h"

#include <algorithm>

#include "runtime/error.h"

namespace cohort::train {

namespace {

using collectives::ReduceOp;

size_t floatsOf(const runtime::Tensor& t) { return t.defined() ? static_cast<size_t>(t.numel()) : 0; }

}  // namespace

ShardSync::ShardSync(collectives::Communicator& shard, const nn::ShardMap& map, nn::ParamBuffer& params,
                     const ShardSyncOptions& options)
    : shard_(shard),
      map_(map),
      params_(params),
      options_(options),
      stage_(options.stage),
      units_(map.units()),
      memory_(options.gpu),
      pool_(memory_) {
  COHORT_CHECK(stage_ >= 1 && stage_ <= 3) << "ZeRO stage " << stage_;
  COHORT_CHECK(map.worldSize() == shard.size() && map.rank() == shard.rank())
      << "a shard map of " << map.worldSize() << " ranks over a communicator of " << shard.size();
  COHORT_CHECK(map.numel() == params.numel() && map.units() == params.units().size())
      << "a shard map of " << map.numel() << " elements for " << params.numel();
  for (size_t u = 0; u < map.units(); ++u) {
    unitOfOffset_[map.unitOffset(u)] = u;
    units_[u].declared = params.units()[u].declared;
    units_[u].padded = map.unit(u).numel < padded(u);
    if (stage_ == 1 && units_[u].padded) units_[u].staging = memory_.zeros(padded(u));
  }
  if (options.precision == runtime::DType::kBF16) {
    plan_.emplace(params, map);
    if (plan_->table().empty()) {
      plan_.reset();  // no parameter is read as bf16: every gather in fp32
    } else {
      wireTable_ = memory_.wireTable(plan_->table());
    }
  }
  if (stage_ == 1) return;
  gradShard_ = memory_.zeros(map.shardNumel());
  if (stage_ == 3) valueShard_ = packedValues();
  // The units nobody reports keep their windows; the others get theirs when computed with.
  for (size_t u = 0; u < units_.size(); ++u) {
    if (units_[u].declared) continue;
    units_[u].gradWindow = pool_.take(padded(u));
    if (stage_ == 3) {
      units_[u].valueWindow = pool_.take(padded(u));
      memory_.copy(units_[u].valueWindow, params.values().data() + map.unitOffset(u), map.unit(u).numel);
    }
  }
  params_.dropWhole({.values = stage_ == 3, .grads = true});
  for (size_t u = 0; u < units_.size(); ++u) {
    if (!units_[u].declared) params_.placeUnit(u, units_[u].valueWindow, units_[u].gradWindow);
  }
}

// The padding stays zero (zeros()); on a GPU the copies are enqueued before anything frees the
// values they read (stage 3: dropWhole, whose memory the caching allocator hands out again only to
// later work on the same stream).
runtime::Tensor ShardSync::packedValues() const {
  runtime::Tensor shard = memory_.zeros(map_.shardNumel());
  for (const nn::ShardMap::Piece& p : map_.pieces(map_.rank())) {
    const float* from = valueShard_.defined() ? valueShard_.data() + p.shardOffset : params_.values().data() + p.flatBegin;
    memory_.copy(shard.data() + p.shardOffset, from, p.realNumel());
  }
  return shard;
}

void ShardSync::await(collectives::WorkPtr& work) {
  if (const runtime::Stream* stream = memory_.stream()) {
    work->waitOn(*stream, options_.timeout);
  } else {
    work->wait(options_.timeout);
  }
  work.reset();
}

size_t ShardSync::unitAt(size_t flatOffset) const {
  const auto it = unitOfOffset_.find(flatOffset);
  COHORT_CHECK(it != unitOfOffset_.end()) << "no parameter unit starts at element " << flatOffset;
  return it->second;
}

size_t ShardSync::neighbour(size_t u, int direction) const {
  for (auto v = static_cast<ptrdiff_t>(u) + direction; v >= 0 && v < static_cast<ptrdiff_t>(units_.size());
       v += direction) {
    if (units_[static_cast<size_t>(v)].declared) return static_cast<size_t>(v);
  }
  return units_.size();
}

void ShardSync::beginPass(int microBatch, int microBatches) {
  microBatch_ = microBatch;
  microBatches_ = microBatches;
}

// Stage 3: the unit's parameters gathered (prefetched, or now), the next unit's gather started.
void ShardSync::beforeForward(const nn::ParamBuffer::Unit& unit) {
  if (stage_ != 3) return;
  const size_t u = unitAt(unit.offset);
  startGather(u, Form::kForPasses);
  finishGather(u);
  if (const size_t next = neighbour(u, +1); options_.prefetch && next < units_.size()) {
    startGather(next, Form::kForPasses);
  }
}

void ShardSync::afterForward(const nn::ParamBuffer::Unit& unit) {
  if (stage_ == 3) releaseValues(unitAt(unit.offset));
}

// Stage 3: gathered again (the previous unit's prefetched); stages 2 and 3: the gradient's window.
void ShardSync::beforeBackward(const nn::ParamBuffer::Unit& unit) {
  if (stage_ == 1) return;
  const size_t u = unitAt(unit.offset);
  if (stage_ == 3) {
    startGather(u, Form::kForPasses);
    finishGather(u);
    const size_t previous = neighbour(u, -1);
    if (options_.prefetch && previous < units_.size()) startGather(previous, Form::kForPasses);
  }
  reapReduced();
  UnitState& s = units_[u];
  if (s.gradWindow) return;  // a later micro-batch: the layers add to it
  s.gradWindow = pool_.take(padded(u));
  params_.placeUnit(u, nullptr, s.gradWindow);
}

void ShardSync::afterBackward(const nn::ParamBuffer::Unit& unit) {
  const size_t u = unitAt(unit.offset);
  if (stage_ == 3) releaseValues(u);
  if (microBatch_ + 1 < microBatches_) return;  // the next micro-batch adds to the gradient
  COHORT_CHECK(!units_[u].reduced) << "unit " << unit.name << " reported twice in one backward";
  startReduce(u);
}

// The unit's reduce-scatter (average), in place: in the whole gradient buffer or its staging (stage
// 1), in its window (stages 2 and 3).
void ShardSync::startReduce(size_t u) {
  UnitState& s = units_[u];
  const size_t n = map_.unit(u).numel, piece = map_.pieceNumel(u);
  const size_t mine = static_cast<size_t>(map_.rank()) * piece;
  float* input = nullptr;
  if (stage_ >= 2) {
    COHORT_CHECK(s.gradWindow) << "unit " << map_.unit(u).name
                               << "'s gradient has no window: its beforeBackward was not told";
    input = s.gradWindow;
  } else if (s.padded) {
    memory_.copy(s.staging.data(), params_.grads().data() + map_.unitOffset(u), n);
    memory_.zero(s.staging.data() + n, padded(u) - n);
    input = s.staging.data();
  } else {
    input = params_.grads().data() + map_.unitOffset(u);
  }
  s.reduce = shard_.reduceScatter(input, input + mine, piece, {.op = ReduceOp::kAvg});
  s.reduced = true;
  reduceOrder_.push_back(u);
  ++reduceScatters_;
}

// Waits for the unit's reduce-scatter and puts its piece where the optimizer reads it; a reported
// unit's gradient window goes back to the pool.
void ShardSync::placeReduced(size_t u) {
  UnitState& s = units_[u];
  await(s.reduce);
  const nn::ShardMap::Piece p = map_.piece(u, map_.rank());
  if (stage_ == 1) {
    if (s.padded) memory_.copy(params_.grads().data() + p.flatBegin, s.staging.data() + p.inUnit, p.realNumel());
    return;
  }
  memory_.copy(gradShard_.data() + p.shardOffset, s.gradWindow + p.inUnit, p.numel);
  if (!s.declared) return;
  pool_.give(s.gradWindow);
  s.gradWindow = nullptr;
  params_.clearUnit(u, {.grads = true});
}

// Reduce-scatters already done give their windows back (stages 2 and 3), and beyond
// kReduceScattersInFlight the oldest are placed too (the CPU waits for them; on a GPU the compute
// stream does; the header says why): the pool stays at the windows really in flight.
void ShardSync::reapReduced() {
  for (size_t u = 0; u < units_.size(); ++u) {
    if (units_[u].reduce && units_[u].declared && units_[u].reduce->done()) placeReduced(u);
  }
  size_t flying = 0;
  for (size_t u : reduceOrder_) flying += units_[u].reduce && units_[u].declared ? 1 : 0;
  for (size_t u : reduceOrder_) {
    if (flying <= kReduceScattersInFlight) break;
    if (!units_[u].reduce || !units_[u].declared) continue;
    placeReduced(u);
    --flying;
  }
}

void ShardSync::finishGradients() {
  for (size_t u = 0; u < units_.size(); ++u) {
    if (!units_[u].reduced) startReduce(u);
  }
  for (size_t u = 0; u < units_.size(); ++u) {
    if (units_[u].reduce) placeReduced(u);
    units_[u].reduced = false;
    COHORT_CHECK(!units_[u].declared || !units_[u].valueWindow)
        << "unit " << map_.unit(u).name << "'s parameters are still gathered after backward";
  }
  reduceOrder_.clear();
  if (!options_.cross || options_.cross->size() == 1) return;
  // Scope node: every node's same piece, averaged across the nodes (its real elements only).
  std::vector<collectives::WorkPtr> work;
  for (size_t u = 0; u < units_.size(); ++u) {
    const nn::ShardMap::Piece p = map_.piece(u, map_.rank());
    if (p.realNumel() == 0) continue;
    float* mine = stage_ == 1 ? params_.grads().data() + p.flatBegin : gradShard_.data() + p.shardOffset;
    work.push_back(options_.cross->allReduce(mine, mine, p.realNumel(), {.op = ReduceOp::kAvg}));
  }
  for (auto& w : work) await(w);
}

collectives::WorkPtr ShardSync::allGather(const void* input, void* output, size_t countPerRank, runtime::DType type) {
  gatheredBytes_ += countPerRank * runtime::sizeOf(type) * static_cast<size_t>(map_.worldSize());
  return shard_.allGather(input, output, countPerRank, {.dtype = type});
}

// The message buffer holds W slots of words(u) 16-bit words (rounded up to whole floats, the pool's
// unit); the all-gather fills every slot, this rank's in place.
collectives::WorkPtr ShardSync::startMessage(size_t u, const float* piece) {
  UnitState& s = units_[u];
  COHORT_CHECK(!s.message) << "unit " << map_.unit(u).name << " sent twice at once";
  const size_t words = plan_->words(u), ranks = static_cast<size_t>(map_.worldSize());
  s.message = pool_.take((words * ranks + 1) / 2, WindowPool::Fill::kAsItIs);
  auto* message = reinterpret_cast<uint16_t*>(s.message);
  uint16_t* slot = message + static_cast<size_t>(map_.rank()) * words;
  const GatherPlan::Slice pack = plan_->pack(u);
  memory_.packWire(piece, slot, ShardMemory::segments(wireTable_) + pack.first, pack.count);
  return allGather(slot, message, words, runtime::DType::kBF16);
}

void ShardSync::finishMessage(size_t u, float* unit, int keep) {
  UnitState& s = units_[u];
  const auto unpack = [&](GatherPlan::Ranks ranks) {
    const GatherPlan::Slice slice = plan_->unpack(u, ranks);
    memory_.unpackWire(reinterpret_cast<const uint16_t*>(s.message), unit,
                       ShardMemory::segments(wireTable_) + slice.first, slice.count);
  };
  if (keep < 0) {
    unpack({.first = 0, .end = map_.worldSize()});
  } else {
    unpack({.first = 0, .end = keep});
    unpack({.first = keep + 1, .end = map_.worldSize()});
  }
  pool_.give(s.message);  // a later take reuses it after these kernels (the stream's order)
  s.message = nullptr;
}

// Stage 3: the unit's parameters into a window of their own, from every rank's piece: a declared
// unit's once per pass (nothing when gathered or on its way), an implicit unit's (its window kept)
// whenever asked.
void ShardSync::startGather(size_t u, Form form) {
  UnitState& s = units_[u];
  if (s.gather || (s.declared && s.valueWindow)) return;
  if (!s.valueWindow) {
    s.valueWindow = pool_.take(padded(u), WindowPool::Fill::kAsItIs);  // the gather fills it
    params_.placeUnit(u, s.valueWindow, nullptr);
  }
  const float* mine = valueShard_.data() + map_.shardOffset(u);
  s.gather = sendsWire(u, form) ? startMessage(u, mine)
                                : allGather(mine, s.valueWindow, map_.pieceNumel(u), runtime::DType::kF32);
}

void ShardSync::finishGather(size_t u) {
  UnitState& s = units_[u];
  if (s.gather) await(s.gather);
  if (s.message) finishMessage(u, s.valueWindow, -1);
}

void ShardSync::releaseValues(size_t u) {
  UnitState& s = units_[u];
  if (!s.declared || !s.valueWindow) return;
  COHORT_CHECK(!s.gather && !s.message) << "unit " << map_.unit(u).name << " released while its gather is in flight";
  pool_.give(s.valueWindow);
  s.valueWindow = nullptr;
  params_.clearUnit(u, {.values = true});
}

void ShardSync::gatherAll() {
  if (stage_ != 3) return;
  for (size_t u = 0; u < units_.size(); ++u) startGather(u, Form::kExact);
  for (size_t u = 0; u < units_.size(); ++u) finishGather(u);
}

void ShardSync::releaseAll() {
  for (size_t u = 0; u < units_.size(); ++u) releaseValues(u);
}

// Stage 3: the implicit units' windows (the others are gathered when computed with), at most
// kMessagesInFlight messages held.
void ShardSync::gatherParams() {
  if (stage_ != 3) {
    gatherWhole();
    return;
  }
  std::vector<size_t> implicit;
  for (size_t u = 0; u < units_.size(); ++u) {
    if (!units_[u].declared) implicit.push_back(u);
  }
  for (size_t i = 0; i < implicit.size(); ++i) {
    if (i >= kMessagesInFlight) finishGather(implicit[i - kMessagesInFlight]);
    startGather(implicit[i], Form::kForPasses);
  }
  for (size_t u : implicit) finishGather(u);
}

// Stages 1 and 2: in place in the whole buffer where W divides the unit, else through a staging
// buffer (stage 1's, or a window at 2); a wire unit through its message, unpacked into the other
// ranks' pieces (this rank's is the master), at most kMessagesInFlight messages held.
void ShardSync::gatherWhole() {
  std::vector<collectives::WorkPtr> work(units_.size());
  std::vector<float*> staged(units_.size(), nullptr);
  std::vector<size_t> sent;  // units whose message is in flight, oldest first
  size_t oldest = 0;
  for (size_t u = 0; u < units_.size(); ++u) {
    const size_t piece = map_.pieceNumel(u);
    const nn::ShardMap::Piece p = map_.piece(u, map_.rank());
    UnitState& s = units_[u];
    float* unit = params_.values().data() + map_.unitOffset(u);
    if (sendsWire(u, Form::kForPasses)) {
      for (; sent.size() - oldest >= kMessagesInFlight; ++oldest) {
        finishWhole(sent[oldest], work[sent[oldest]], nullptr);
      }
      work[u] = startMessage(u, unit + p.inUnit);
      sent.push_back(u);
      continue;
    }
    if (!s.padded) {
      work[u] = allGather(unit + p.inUnit, unit, piece, runtime::DType::kF32);
      continue;
    }
    staged[u] = stage_ == 1 ? s.staging.data() : pool_.take(padded(u), WindowPool::Fill::kAsItIs);
    float* mine = staged[u] + p.inUnit;
    memory_.copy(mine, params_.values().data() + p.flatBegin, p.realNumel());
    memory_.zero(mine + p.realNumel(), piece - p.realNumel());
    work[u] = allGather(mine, staged[u], piece, runtime::DType::kF32);
  }
  for (size_t u = 0; u < units_.size(); ++u) {
    if (work[u]) finishWhole(u, work[u], staged[u]);
  }
}

// Stages 1 and 2: unit u's gather awaited and its elements put in the whole buffer.
void ShardSync::finishWhole(size_t u, collectives::WorkPtr& work, float* staged) {
  await(work);
  UnitState& s = units_[u];
  float* unit = params_.values().data() + map_.unitOffset(u);
  if (s.message) finishMessage(u, unit, map_.rank());  // this rank's piece is the master
  if (!staged) return;
  memory_.copy(unit, staged, map_.unit(u).numel);
  if (stage_ == 2) pool_.give(staged);
}

void ShardSync::gatherShard(const float* shard, float* flat) {
  for (size_t u = 0; u < units_.size(); ++u) {
    float* unit = pool_.take(padded(u), WindowPool::Fill::kAsItIs);
    collectives::WorkPtr work = allGather(shard + map_.shardOffset(u), unit, map_.pieceNumel(u), runtime::DType::kF32);
    await(work);
    memory_.copy(flat + map_.unitOffset(u), unit, map_.unit(u).numel);
    pool_.give(unit);
  }
}

float* ShardSync::grads() { return stage_ >= 2 ? gradShard_.data() : params_.grads().data(); }

float* ShardSync::values() { return stage_ == 3 ? valueShard_.data() : params_.values().data(); }

size_t ShardSync::stagingBytes() const {
  size_t floats = floatsOf(wireTable_);
  for (const UnitState& s : units_) floats += floatsOf(s.staging);
  return floats * sizeof(float) + pool_.bytes();
}

size_t ShardSync::shardBytes() const {
  return (floatsOf(gradShard_) + floatsOf(valueShard_)) * sizeof(float);
}

}  // namespace cohort::train
