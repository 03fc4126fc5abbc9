#include "train/placement/placement.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "nn/grad_norm.h"
#include "runtime/error.h"
#include "train/checkpoint/checkpointer.h"
#include "train/step_graph.h"

#ifdef COHORT_HAVE_CUDA
#include "runtime/cuda/elementwise.h"
#include "runtime/cuda/gpu_context.h"
#endif

namespace cohort::train {

void CheckpointReader::load(const std::string& name, const runtime::Tensor& into) const {
  const runtime::Tensor* t = checkpoint_.find(name);
  if (!t) COHORT_THROW(IoError) << path_ << ": checkpoint has no tensor '" << name << "'";
  if (t->numel() != into.numel()) {
    COHORT_THROW(IoError) << path_ << ": tensor '" << name << "' has shape " << t->shape().str() << ", the model needs "
                          << into.shape().str();
  }
  into.copyFrom(*t);
}

const std::string& CheckpointReader::text(const std::string& key) const {
  return metadataText(checkpoint_.metadata, key, path_);
}

int64_t CheckpointReader::count(const std::string& key) const {
  return metadataCount(checkpoint_.metadata, key, path_);
}

collectives::CommunicatorOptions::FaultInjection faultInjectionOf(const TestHooks& hooks) {
  return {.rank = hooks.mpiMismatch.rank, .mismatchAt = hooks.mpiMismatch.sequence};
}

void moveToGpu(nn::ParamBuffer& params, runtime::cuda::GpuContext* gpu) {
  if (!gpu) return;
#ifdef COHORT_HAVE_CUDA
  params.relocate({.device = gpu->device(), .allocator = &gpu->allocator()});
#else
  COHORT_CHECK(false) << "a GPU context without CUDA";
#endif
}

const runtime::Stream* computeStreamOf(runtime::cuda::GpuContext* gpu) {
#ifdef COHORT_HAVE_CUDA
  if (gpu) return &gpu->stream();
#endif
  (void)gpu;
  return nullptr;
}

void scaleGradients(const nn::ParamBuffer& params, float scale, runtime::cuda::GpuContext* gpu) {
  if (scale == 1.0f) return;
  const runtime::Tensor& g = params.grads();
#ifdef COHORT_HAVE_CUDA
  if (g.device().isCuda()) {
    COHORT_CHECK(gpu) << "gradients on " << g.device().str() << " without a GPU context";
    runtime::cuda::scale({g.data(), static_cast<size_t>(g.numel())}, scale, gpu->stream());
    return;
  }
#endif
  (void)gpu;
  float* data = g.data();
  for (int64_t i = 0, n = g.numel(); i < n; ++i) data[i] *= scale;
}

LossVerdict LossVerdict::own(OwnLoss loss, int rank) {
  return {.nonFiniteRank = loss.finite ? -1 : rank, .spikeRank = loss.finite && loss.spike ? rank : -1};
}

float LossVerdict::vote(OwnLoss loss, int rank, int worldSize) {
  if (!loss.finite) return static_cast<float>(2 * worldSize - rank);
  return loss.spike ? static_cast<float>(worldSize - rank) : 0.0f;
}

LossVerdict LossVerdict::ofVotes(float maxVote, int worldSize) {
  const auto v = static_cast<int>(maxVote);
  if (v > worldSize) return {.nonFiniteRank = 2 * worldSize - v};
  if (v > 0) return {.spikeRank = worldSize - v};
  return {};
}

PartialNorm WholeGradient::squaredNorm(const StepPlan& plan) const {
  return {.squares = plan.guard->sumOfSquares(params.grads()), .scale = plan.gradScale};
}

// A trusted bf16 copy (nn/param_buffer.h) is kept current by the optimizer's own kernel
// (Job::trustHalfCopy hands it the copy): the step writes both.
void WholeGradient::requireHalfCopyWriter() const {
  COHORT_CHECK(!params.halfCopyTrusted() || optimizer.halfCopy() == params.halfCopy())
      << "a trusted bf16 copy that the optimizer does not write";
}

void WholeGradient::update(const StepPlan& plan, float clip) const {
  requireHalfCopyWriter();
  scaleGradients(params, plan.gradScale * clip, gpu);
  optimizer.step(params.values(), params.grads());
}

StepResult WholeGradient::stepDeferred(const StepPlan& plan, LossVerdict loss, int gradientRank) const {
  requireHalfCopyWriter();
  // The host's part and the uncaptured writes of what changes per step (`stage`); the kernels that
  // read them, which a CUDA graph may capture (`device`); then the record's copy into its ring slot.
  const auto stage = [&] {
    plan.guard->stageJudge({.gradScale = plan.gradScale,
                            .clipGradNorm = plan.clipGradNorm,
                            .loss = loss,
                            .gradientRank = gradientRank,
                            .maxGradNorm = plan.maxGradNorm,
                            .skipsLeft = plan.skipsLeft,
                            .settledSteps = optimizer.steps()});
    optimizer.stageDeferred({.lrIfSettled = plan.lrIfSettled, .lrIfOneMore = plan.lrIfOneMore});
  };
  const auto device = [&] {
    optimizer.applyDeferred(params.values(), params.grads(), plan.guard->judgeOnDevice(params.grads()));
  };
  if (plan.graph) {
    plan.graph->finishStep(stage, device);
  } else {
    stage();
    device();
  }
  plan.guard->sendRecord();
  return StepResult{.pending = true};
}

StepResult Placement::stepDeferred(const StepPlan&, LossVerdict) {
  COHORT_CHECK(false) << "a deferred step on a placement that does not hold the whole gradient";
  return {};
}

SavedState singleOptimizerState(const nn::Optimizer& optimizer) {
  SavedState saved;
  for (const auto& s : optimizer.state()) saved.tensors.push_back({"optimizer." + s.name, s.tensor});
  saved.metadata["optimizer_steps"] = std::to_string(optimizer.steps());
  return saved;
}

void loadSingleOptimizerState(const CheckpointReader& reader, nn::Optimizer& optimizer) {
  for (const auto& s : optimizer.state()) reader.load("optimizer." + s.name, s.tensor);
  optimizer.setSteps(reader.count("optimizer_steps"));
}

void loadParams(const CheckpointReader& reader, const nn::ParamBuffer& params) {
  for (size_t i = 0; i < params.entries().size(); ++i) reader.load(params.entries()[i].name, params.value(i));
}

}  // namespace cohort::train
