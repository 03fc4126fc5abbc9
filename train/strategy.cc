#include "train/strategy.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "nn/grad_norm.h"
#include "runtime/error.h"
#include "train/checkpointer.h"

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

int64_t CheckpointReader::count(const std::string& key) const { return metadataCount(checkpoint_.metadata, key, path_); }

void moveToGpu(nn::ParamBuffer& params, runtime::cuda::GpuContext* gpu) {
  if (!gpu) return;
#ifdef COHORT_HAVE_CUDA
  params.relocate({.device = gpu->device(), .allocator = &gpu->allocator()});
#else
  COHORT_CHECK(false) << "a GPU context without CUDA";
#endif
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

StepResult judgeStep(double gradNorm, LossVerdict loss, int gradientRank, double maxGradNorm) {
  StepResult r{.gradNorm = gradNorm};
  if (loss.nonFiniteRank >= 0) {
    r.nonFinite = NonFinite::kLoss;
    r.rank = loss.nonFiniteRank;
  } else if (!std::isfinite(gradNorm)) {
    r.nonFinite = NonFinite::kGradient;
    r.rank = gradientRank;
  } else if (loss.spikeRank >= 0) {
    r.spike = Spike::kLoss;
    r.rank = loss.spikeRank;
  } else if (gradNorm > maxGradNorm) {
    r.spike = Spike::kGradient;
    r.rank = gradientRank;
    r.gradNormLimit = maxGradNorm;
  }
  r.applied = r.nonFinite == NonFinite::kNone && r.spike == Spike::kNone;
  return r;
}

StepResult stepWholeGradient(const StepPlan& plan, LossVerdict loss, int gradientRank, nn::ParamBuffer& params,
                             nn::Optimizer& optimizer, runtime::cuda::GpuContext* gpu, Timeline& timeline) {
  COHORT_CHECK(plan.guard) << "a step without the job's StepGuard";
  Timeline::Scope span(timeline, SpanKind::kOptimizer);
  if (plan.defer) {
    const runtime::cuda::StepControl* control = plan.guard->judge(params.grads(), {.gradScale = plan.gradScale,
                                                                                    .clipGradNorm = plan.clipGradNorm,
                                                                                    .loss = loss,
                                                                                    .gradientRank = gradientRank,
                                                                                    .maxGradNorm = plan.maxGradNorm,
                                                                                    .skipsLeft = plan.skipsLeft,
                                                                                    .settledSteps = optimizer.steps()});
    optimizer.stepDeferred(params.values(), params.grads(),
                           {.control = control, .lrIfSettled = plan.lrIfSettled, .lrIfOneMore = plan.lrIfOneMore});
    return StepResult{.pending = true};
  }
  const double norm = static_cast<double>(plan.gradScale) * std::sqrt(plan.guard->sumOfSquares(params.grads()));
  StepResult result = judgeStep(norm, loss, gradientRank, plan.maxGradNorm);
  if (!result.applied) return result;
  const float clip = plan.clipGradNorm > 0 ? nn::clipCoefficient(norm, plan.clipGradNorm) : 1.0f;
  scaleGradients(params, plan.gradScale * clip, gpu);
  optimizer.step(params.values(), params.grads());
  return result;
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

void reduceRows(std::span<double> values, std::span<const double> all, int ranks, ScalarOp op) {
  const size_t n = values.size();
  for (size_t i = 0; i < n; ++i) {
    double acc = all[i];
    for (int r = 1; r < ranks; ++r) {
      const double v = all[static_cast<size_t>(r) * n + i];
      acc = op == ScalarOp::kMax ? std::max(acc, v) : acc + v;
    }
    values[i] = op == ScalarOp::kMean ? acc / ranks : acc;
  }
}

std::vector<double> gatherDoubles(collectives::Communicator& comm, std::span<const double> mine,
                                  std::chrono::milliseconds timeout) {
  static_assert(sizeof(double) == 2 * sizeof(float));
  std::vector<double> all(static_cast<size_t>(comm.size()) * mine.size());
  if (mine.empty()) return all;
  std::vector<float> sent(2 * mine.size()), received(2 * all.size());
  std::memcpy(sent.data(), mine.data(), mine.size_bytes());
  comm.allGather(sent.data(), received.data(), sent.size(), {})->wait(timeout);
  std::memcpy(all.data(), received.data(), all.size() * sizeof(double));
  return all;
}

}  // namespace cohort::train
