#include "train/placement/sharded_placement.h"

#include <algorithm>
#include <vector>

#include "collectives/split.h"
#include "nn/grad_norm.h"
#include "runtime/error.h"
#include "train/step/step_pipeline.h"

namespace cohort::train {

namespace {

// Scope node needs every node to run as many ranks (the nodes' maps must cut alike): refused on
// every rank otherwise, naming two sizes.
void requireEvenNodes(collectives::Communicator& world, int nodeSize, std::chrono::milliseconds timeout) {
  const double mine = nodeSize;
  const std::vector<double> sizes = gatherDoubles(world, {&mine, 1}, timeout);
  for (size_t r = 1; r < sizes.size(); ++r) {
    if (sizes[r] != sizes[0]) {
      COHORT_THROW(InvalidArgument) << "ZeRO scope node needs as many ranks on every node, but rank 0's node runs "
                                    << sizes[0] << " and rank " << r << "'s " << sizes[r]
                                    << ": use scope job, or the same number of workers per node";
    }
  }
}

}  // namespace

ShardedPlacement::ShardedPlacement(const PlacementContext& c, const ShardedOptions& options)
    : params_(c.params), optimizer_(c.optimizer), timeout_(c.timeout), timeline_(c.timeline), options_(options) {
  COHORT_CHECK(!c.gpu) << "the sharded placement runs on the CPU";
  COHORT_CHECK(options.stage == 1 || options.stage == 2) << "ZeRO stage " << options.stage;
  world_ = collectives::makeCommunicator({.backend = options.backend,
                                          .world = c.world,
                                          .timeout = c.timeout,
                                          .faultInjection = faultInjectionOf(c.testHooks)});
  if (options.scope == ZeroScope::kNode && c.world.spansNodes()) {
    node_ = collectives::splitNodeRanks(*world_, c.world);
    cross_ = collectives::splitSameLocalRank(*world_, c.world);
    requireEvenNodes(*world_, node_->size(), c.timeout);
  }
  collectives::Communicator& shard = node_ ? *node_ : *world_;
  // Every rank initialises the whole model, then takes rank 0's (a program's own initialisation may
  // differ between ranks), as replicas do.
  c.initialise();
  world_->broadcast(params_.values().data(), params_.numel(), 0)->wait(timeout_);
  // The flat buffers in the shard communicator's memory: shm reduces and gathers where they lie.
  values_ = shard.allocateBuffer(params_.numel());
  params_.relocate({.values = values_->data(), .device = runtime::Device::cpu(), .allocator = &runtime::cpuAllocator()});
  grads_ = shard.allocateBuffer(params_.numel());
  params_.placeGrads(grads_->data());
  map_.emplace(nn::shardMapOf(params_, {.worldSize = shard.size(), .rank = shard.rank()}));
  optimizer_.shardOver(*map_);
  sync_ = std::make_unique<ShardSync>(shard, *map_, params_,
                                      ShardSyncOptions{.cross = cross_.get(), .timeout = c.timeout, .timeline = &c.timeline});
}

ShardedPlacement::~ShardedPlacement() = default;

std::optional<StateBytes> ShardedPlacement::stateBytes() const {
  return StateBytes{.params = params_.bytes(),
                    .grads = params_.bytes(),
                    .optimizer = optimizer_.stateFloats() * sizeof(float),
                    .staging = sync_->stagingBytes()};
}

std::unique_ptr<JobCollectives> ShardedPlacement::makeCollectives() {
  return std::make_unique<CommCollectives>(*world_, timeout_, timeline_);
}

// The vote rides on the world's communicator (behind the reduce-scatters where that is the shard
// group's too); both waits are the step's kCommWait.
void ShardedPlacement::reduceGradients(const StepPlan&, LossVote& vote) {
  vote.start(*world_);
  Timeline::Scope span(timeline_, SpanKind::kCommWait);
  sync_->finishGradients();
  vote.finish(timeout_);
}

PartialNorm ShardedPlacement::squaredNorm(const StepPlan& plan) {
  const float* grads = params_.grads().data();
  double squares = 0;
  for (const nn::ShardMap::Piece& p : optimizer_.shardPieces()) {
    squares += nn::sumOfSquares({grads + p.flatBegin, p.realNumel()});
  }
  return {.squares = squares, .scale = plan.gradScale};
}

// The shard group's rows, added in rank order (scope node: every node holds the same pieces, so
// the node's sum is the job's).
void ShardedPlacement::reducePartials(std::span<double, 2> sumAndBallot) {
  collectives::Communicator& shard = node_ ? *node_ : *world_;
  const std::vector<double> rows = gatherDoubles(shard, sumAndBallot, timeout_);
  double total = 0, ballot = 0;
  for (size_t r = 0; r < rows.size() / 2; ++r) {
    total += rows[2 * r];
    ballot = std::max(ballot, rows[2 * r + 1]);
  }
  sumAndBallot[0] = total;
  sumAndBallot[1] = ballot;
}

// Each piece's gradient scaled once (gradScale times the clip coefficient, the whole-gradient
// update's one multiply) while it is hot, then stepped in place.
void ShardedPlacement::update(const StepPlan& plan, float clip) {
  Timeline::Scope span(timeline_, SpanKind::kOptimizer);
  const float scale = plan.gradScale * clip;
  float* grads = params_.grads().data();
  nn::Optimizer::PieceBuffers buffers{.values = params_.values().data(), .grads = grads};
  if (scale != 1.0f) {
    buffers.prepare = [grads, scale](const nn::ShardMap::Piece& p) {
      for (size_t i = p.flatBegin; i < p.flatEnd; ++i) grads[i] *= scale;
    };
  }
  optimizer_.stepPieces(buffers);
}

void ShardedPlacement::packParams(float* shard) const { map_->pack(params_.values().data(), map_->rank(), shard); }

void ShardedPlacement::unpackParams(const float* shard) {
  float* values = params_.values().data();
  for (const nn::ShardMap::Piece& p : optimizer_.shardPieces()) {
    std::copy(shard + p.shardOffset, shard + p.shardOffset + p.realNumel(), values + p.flatBegin);
  }
}

void ShardedPlacement::gatherParams() {
  Timeline::Scope span(timeline_, SpanKind::kCommWait);
  sync_->gatherParams();
}

// A skipped step changed no piece: nothing to gather.
void ShardedPlacement::endStep(const StepResult& result) {
  if (!result.applied) return;
  gatherParams();
}

}  // namespace cohort::train
