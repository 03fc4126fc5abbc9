#include "train/placement/replica_placement.h"

#include "train/step/step_pipeline.h"

namespace cohort::train {

ReplicaPlacement::ReplicaPlacement(const PlacementContext& c, const std::string& backend)
    : WholeGradientPlacement({c.params, c.optimizer, c.gpu}), timeout_(c.timeout), timeline_(c.timeline) {
  // On a GPU the gradient buckets are all-reduced over NCCL, ordered after backward's kernels by events.
  comm_ = collectives::makeCommunicator(
      {.backend = backend,
       .world = c.world,
       .timeout = c.timeout,
       .computeStream = computeStreamOf(c.gpu),
       .faultInjection = faultInjectionOf(c.testHooks)});
  // Each rank initialises its own replica (BatchNorm buffers included), then rank 0's parameters
  // are broadcast to all of them.
  c.initialise();
  moveToGpu(c.params, c.gpu);
  if (c.params.values().device().isCpu()) {
    grads_ = comm_->allocateBuffer(c.params.numel());
    c.params.placeGrads(grads_->data());
  }
  gradSync_ =
      std::make_unique<GradSync>(*comm_, c.params, GradSyncOptions{.timeout = c.timeout, .timeline = &c.timeline});
  gradSync_->broadcastParams();
}

std::unique_ptr<JobCollectives> ReplicaPlacement::makeCollectives() {
  return std::make_unique<CommCollectives>(*comm_, timeout_, timeline_);
}

// The vote is queued behind the gradient buckets on the one communicator, so that its latency hides
// in theirs; both waits are the step's kCommWait.
void ReplicaPlacement::reduceGradients(const StepPlan&, LossVote& vote) {
  vote.start(*comm_);
  Timeline::Scope span(timeline_, SpanKind::kCommWait);
  gradSync_->finish();
  vote.finish(timeout_);
}

void ReplicaPlacement::loadState(const CheckpointReader& reader) {
  loadParams(reader, whole_.params);
  loadSingleOptimizerState(reader, whole_.optimizer);
}

}  // namespace cohort::train
