#include "train/replica_strategy.h"

#include <algorithm>

#ifdef COHORT_HAVE_CUDA
#include "runtime/cuda/gpu_context.h"
#endif

namespace cohort::train {

namespace {

const runtime::Stream* computeStreamOf(runtime::cuda::GpuContext* gpu) {
#ifdef COHORT_HAVE_CUDA
  if (gpu) return &gpu->stream();
#endif
  (void)gpu;
  return nullptr;
}

}  // namespace

ReplicaStrategy::ReplicaStrategy(const StrategyContext& c, const std::string& backend)
    : params_(c.params),
      optimizer_(c.optimizer),
      gpu_(c.gpu),
      timeout_(c.timeout),
      timeline_(c.timeline),
      rank_(c.world.rank),
      worldSize_(c.world.worldSize) {
  // On a GPU the gradient buckets are all-reduced over NCCL, ordered after backward's kernels by events.
  comm_ = collectives::makeCommunicator(
      {.backend = backend, .world = c.world, .timeout = c.timeout, .computeStream = computeStreamOf(c.gpu)});
  // Each rank initialises its own replica (BatchNorm buffers included), then rank 0's parameters
  // are broadcast to all of them.
  c.initialise();
  moveToGpu(params_, gpu_);
  if (params_.values().device().isCpu()) {
    grads_ = comm_->allocateBuffer(params_.numel());
    params_.placeGrads(grads_->data());
  }
  gradSync_ = std::make_unique<GradSync>(*comm_, params_, GradSyncOptions{.timeout = c.timeout, .timeline = &c.timeline});
  gradSync_->broadcastParams();
}

// Every replica holds the same averaged gradient (the all-reduce's result is bitwise the same on
// every rank), so every rank measures the same norm and reaches the same verdict. The ranks' loss
// votes (LossVerdict) travel in one small all-reduce, queued behind the gradient buckets so that
// its latency hides in theirs.
StepResult ReplicaStrategy::step(const StepPlan& plan) {
  collectives::WorkPtr flagWork;
  if (plan.exchangeLoss) {
    lossFlag_ = LossVerdict::vote(plan.loss, rank_, worldSize_);
    flagWork = comm_->allReduce(&lossFlag_, &lossFlag_, 1, {.op = collectives::ReduceOp::kMax});
  }
  LossVerdict loss = LossVerdict::own(plan.loss, rank_);
  {
    Timeline::Scope span(timeline_, SpanKind::kCommWait);
    gradSync_->finish();
    if (flagWork) {
      flagWork->wait(timeout_);
      loss = LossVerdict::ofVotes(lossFlag_, worldSize_);
    }
  }
  return stepWholeGradient(plan, loss, -1, params_, optimizer_, gpu_, timeline_);
}

void ReplicaStrategy::barrier(const std::string&) {
  Timeline::Scope span(timeline_, SpanKind::kBarrier);
  comm_->barrier()->wait(timeout_);
}

// Through float32, the one type every backend reduces: exact for counts below 2^24 and close
// enough (1e-7 relative) for the figures a loop reports.
void ReplicaStrategy::reduce(std::span<double> values, ScalarOp op) {
  float buffer[8];
  for (size_t first = 0; first < values.size(); first += std::size(buffer)) {
    const size_t n = std::min(std::size(buffer), values.size() - first);
    for (size_t i = 0; i < n; ++i) buffer[i] = static_cast<float>(values[first + i]);
    const collectives::ReduceOp reduceOp = op == ScalarOp::kMax    ? collectives::ReduceOp::kMax
                                           : op == ScalarOp::kMean ? collectives::ReduceOp::kAvg
                                                                   : collectives::ReduceOp::kSum;
    comm_->allReduce(buffer, buffer, n, {.op = reduceOp})->wait(timeout_);
    for (size_t i = 0; i < n; ++i) values[first + i] = buffer[i];
  }
}

void ReplicaStrategy::loadState(const CheckpointReader& reader) {
  loadParams(reader, params_);
  loadSingleOptimizerState(reader, optimizer_);
}

}  // namespace cohort::train
