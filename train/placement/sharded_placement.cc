#include "train/placement/sharded_placement.h"

#include <algorithm>
#include <vector>

#include "collectives/split.h"
#include "runtime/error.h"
#include "train/step/step_pipeline.h"

#ifdef COHORT_HAVE_CUDA
#include "runtime/cuda/gpu_context.h"
#endif

namespace cohort::train {

namespace {

// GPU: the caching allocator's freed blocks go back to the driver (after the stream's work, which
// may still read them). Blocks are never split, so a shard would otherwise take a whole buffer's
// block and hold as much memory as the whole buffer did.
void releaseCache(runtime::cuda::GpuContext* gpu, std::chrono::milliseconds timeout) {
#ifdef COHORT_HAVE_CUDA
  if (!gpu) return;
  gpu->stream().synchronize(timeout);
  gpu->allocator().emptyCache();
#endif
  (void)gpu;
  (void)timeout;
}

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
  COHORT_CHECK(options.stage >= 1 && options.stage <= 3) << "ZeRO stage " << options.stage;
  // On a GPU the collectives run over NCCL, ordered against the compute stream (shard_sync.h).
  world_ = collectives::makeCommunicator({.backend = options.backend,
                                          .world = c.world,
                                          .timeout = c.timeout,
                                          .computeStream = computeStreamOf(c.gpu),
                                          .faultInjection = faultInjectionOf(c.testHooks)});
  if (options.scope == ZeroScope::kNode && c.world.spansNodes()) {
    node_ = collectives::splitNodeRanks(*world_, c.world);
    cross_ = collectives::splitSameLocalRank(*world_, c.world);
    requireEvenNodes(*world_, node_->size(), c.timeout);
  }
  collectives::Communicator& shard = node_ ? *node_ : *world_;
  // The optimizer's whole state goes first, before anything else is allocated: the placement's peak
  // stays the whole parameters and gradients Job::place bound.
  map_.emplace(nn::shardMapOf(params_, {.worldSize = shard.size(), .rank = shard.rank()}));
  if (!optimizer_.sharded()) {
    optimizer_.shardOver(*map_);
    releaseCache(c.gpu, c.timeout);  // the whole optimizer state
  } else if (optimizer_.numel() != map_->shardNumel() || optimizer_.shardPieces().size() != map_->units()) {
    COHORT_THROW(InvalidArgument) << "the optimizer was sharded over another map (" << optimizer_.numel()
                                  << " elements, this rank's shard has " << map_->shardNumel()
                                  << "): make it with job.makeOptimizer(options, model)";
  }
  // Every rank initialises the whole model, then takes rank 0's (a program's own initialisation may
  // differ between ranks), as replicas do.
  c.initialise();
  moveToGpu(params_, c.gpu);
  world_->broadcast(params_.values().data(), params_.numel(), 0)->wait(timeout_);
  if (!c.gpu) placeWholeBuffers(shard);
  sync_ = std::make_unique<ShardSync>(
      shard, *map_, params_,
      ShardSyncOptions{.stage = options.stage,
                       .prefetch = options.prefetch,
                       .cross = cross_.get(),
                       .timeout = c.timeout,
                       .timeline = &c.timeline,
                       .gpu = c.gpu,
                       .precision = options.precision});
  releaseCache(c.gpu, c.timeout);  // the whole buffers ShardSync dropped
}

// On the CPU, the whole buffers that the stage keeps go into the shard communicator's memory, where
// shm reduces and gathers them in place (ShardSync drops the others). On a GPU they stay where
// moveToGpu put them (the caching allocator), which NCCL reads as it is.
void ShardedPlacement::placeWholeBuffers(collectives::Communicator& shard) {
  if (options_.stage <= 2) {
    values_ = shard.allocateBuffer(params_.numel());
    params_.relocate({.values = values_->data(), .device = runtime::Device::cpu(), .allocator = &runtime::cpuAllocator()});
  }
  if (options_.stage == 1) {
    grads_ = shard.allocateBuffer(params_.numel());
    params_.placeGrads(grads_->data());
  }
}

ShardedPlacement::~ShardedPlacement() = default;

std::optional<StateBytes> ShardedPlacement::stateBytes() const {
  const size_t shard = map_->shardNumel() * sizeof(float);
  return StateBytes{.params = options_.stage == 3 ? shard : params_.bytes(),
                    .grads = options_.stage >= 2 ? shard : params_.bytes(),
                    .optimizer = optimizer_.stateFloats() * sizeof(float),
                    .staging = sync_->stagingBytes()};
}

// Stages 1 and 2 of a bf16 run hold the other ranks' bf16-read parameters rounded (shard_sync.h):
// the masters are gathered from the pieces instead.
std::optional<runtime::Tensor> ShardedPlacement::gatherWholeParams() {
  if (options_.stage == 3) return gatherToHost(sync_->values());
  if (sync_->gathersBf16()) return gatherToHost(sync_->packedValues().data());
  if (!sync_->memory().onGpu()) return std::nullopt;
  return sync_->memory().toHost(params_.values().data(), params_.numel(), timeout_);
}

runtime::Tensor ShardedPlacement::gatherToHost(const float* shard) {
  const ShardMemory& memory = sync_->memory();
  runtime::Tensor whole = memory.zeros(params_.numel());
  sync_->gatherShard(shard, whole.data());
  if (!memory.onGpu()) return whole;
  return memory.toHost(whole.data(), params_.numel(), timeout_);
}

void ShardedPlacement::beginPass(int microBatch, int microBatches) { sync_->beginPass(microBatch, microBatches); }

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

// Per piece (the real elements), summed in piece order; on a GPU at stages 2 and 3 one sum over
// the packed gradient shard instead, whose padding is zero: the same Σ in one kernel.
PartialNorm ShardedPlacement::squaredNorm(const StepPlan& plan) {
  float* grads = sync_->grads();
  const ShardMemory& memory = sync_->memory();
  std::vector<runtime::Tensor> pieces;
  if (memory.onGpu() && sync_->gradsPacked()) {
    pieces.push_back(memory.view(grads, map_->shardNumel()));
  } else {
    for (const nn::ShardMap::Piece& p : optimizer_.shardPieces()) {
      pieces.push_back(memory.view(grads + (sync_->gradsPacked() ? p.shardOffset : p.flatBegin), p.realNumel()));
    }
  }
  return {.squares = plan.guard->sumOfSquares(pieces), .scale = plan.gradScale};
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
// update's one multiply) while it is hot, then stepped in place; stage 3 steps the packed shards
// (their padding is zero and stays so).
void ShardedPlacement::update(const StepPlan& plan, float clip) {
  Timeline::Scope span(timeline_, SpanKind::kOptimizer);
  const float scale = plan.gradScale * clip;
  float* grads = sync_->grads();
  const bool packed = sync_->gradsPacked();
  const ShardMemory& memory = sync_->memory();
  if (options_.stage == 3) {
    const size_t n = map_->shardNumel();
    memory.scale(grads, n, scale);
    optimizer_.stepShard(memory.view(sync_->values(), n), memory.view(grads, n));
    return;
  }
  nn::Optimizer::PieceBuffers buffers{.values = sync_->values(), .grads = grads, .gradsPacked = packed};
  if (scale != 1.0f) {
    buffers.prepare = [&memory, grads, scale, packed](const nn::ShardMap::Piece& p) {
      memory.scale(grads + (packed ? p.shardOffset : p.flatBegin), p.realNumel(), scale);
    };
  }
  optimizer_.stepPieces(buffers);
}

// Checkpoints: the real elements copied to the host, piece by piece at stages 1 and 2, the packed
// shard at stage 3; on a GPU ordered after the step's kernels and before the next step's.
void ShardedPlacement::packParams(float* shard) const {
  std::fill_n(shard, map_->shardNumel(), 0.0f);
  stageParams(shard);
  sync_->memory().synchronize(timeout_);
}

void ShardedPlacement::stageParams(float* shard) const {
  const ShardMemory& memory = sync_->memory();
  if (options_.stage == 3) {
    memory.copyToHost(shard, sync_->values(), map_->shardNumel());
    return;
  }
  for (const nn::ShardMap::Piece& p : optimizer_.shardPieces()) {
    memory.copyToHost(shard + p.shardOffset, params_.values().data() + p.flatBegin, p.realNumel());
  }
}

void ShardedPlacement::unpackParams(const float* shard) {
  const ShardMemory& memory = sync_->memory();
  float* values = sync_->values();
  const size_t n = options_.stage == 3 ? map_->shardNumel() : params_.numel();
  // On a GPU: the device's values on the host (the stream then idle), the pieces set, copied back.
  runtime::Tensor host = memory.onGpu() ? memory.toHost(values, n, timeout_) : runtime::Tensor();
  float* target = memory.onGpu() ? host.data() : values;
  if (options_.stage == 3) {
    std::copy_n(shard, n, target);
  } else {
    for (const nn::ShardMap::Piece& p : optimizer_.shardPieces()) {
      std::copy(shard + p.shardOffset, shard + p.shardOffset + p.realNumel(), target + p.flatBegin);
    }
  }
  if (memory.onGpu()) memory.view(values, n).copyFrom(host);
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
