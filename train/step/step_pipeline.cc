#include "train/step/step_pipeline.h"

#include <cmath>
#include <optional>

#include "nn/grad_norm.h"
#include "runtime/error.h"

namespace cohort::train {

LossVote::LossVote(const StepPlan& plan, int rank, int worldSize)
    : exchange_(plan.exchangeLoss),
      worldSize_(worldSize),
      ballot_(LossVerdict::vote(plan.loss, rank, worldSize)),
      verdict_(LossVerdict::own(plan.loss, rank)) {}

void LossVote::start(collectives::Communicator& comm) {
  if (!exchange_) return;
  exchanged_ = ballot_;
  work_ = comm.allReduce(&exchanged_, &exchanged_, 1, {.op = collectives::ReduceOp::kMax});
}

void LossVote::finish(std::chrono::milliseconds timeout) {
  if (!work_) return;
  work_->wait(timeout);
  work_.reset();
  verdict_ = LossVerdict::ofVotes(exchanged_, worldSize_);
  settled_ = true;
}

void LossVote::tally(double largestBallot) {
  COHORT_CHECK(!pending()) << "a loss vote started on a communicator was not finished";
  if (exchange_ && !settled_) verdict_ = LossVerdict::ofVotes(static_cast<float>(largestBallot), worldSize_);
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

namespace {

// Stages 3–6: the norm over what this rank holds (reduced where the gradient is split), the
// verdict, the clip coefficient and the update.
StepResult measureJudgeUpdate(Placement& placement, const StepPlan& plan, LossVote& vote) {
  PartialNorm part = placement.squaredNorm(plan);
  if (placement.splitsGradient()) {
    double sumAndBallot[2] = {part.squares, vote.ballot()};
    placement.reducePartials(sumAndBallot);
    part.squares = sumAndBallot[0];
    vote.tally(sumAndBallot[1]);
  }
  const double norm = static_cast<double>(part.scale) * std::sqrt(part.squares);
  StepResult result = judgeStep(norm, vote.verdict(), placement.gradientRank(), plan.maxGradNorm);
  if (!result.applied) return result;
  placement.update(plan, plan.clipGradNorm > 0 ? nn::clipCoefficient(norm, plan.clipGradNorm) : 1.0f);
  return result;
}

}  // namespace

StepResult runStep(Placement& placement, const StepPlan& plan, const StepContext& context) {
  COHORT_CHECK(plan.guard) << "a step without the job's StepGuard";
  COHORT_CHECK(!plan.defer || !placement.splitsGradient()) << "a deferred step of a split gradient";
  placement.beginStep(plan);
  LossVote vote(plan, context.rank, context.worldSize);
  placement.reduceGradients(plan, vote);
  COHORT_CHECK(!vote.pending()) << "reduceGradients started the loss vote and did not finish it";
  StepResult result;
  {
    std::optional<Timeline::Scope> span;
    if (!placement.splitsGradient()) span.emplace(context.timeline, SpanKind::kOptimizer);
    result = plan.defer ? placement.stepDeferred(plan, vote.verdict()) : measureJudgeUpdate(placement, plan, vote);
  }
  placement.endStep(result);
  return result;
}

}  // namespace cohort::train
