// The one training step (docs/architecture.md, "One training step"): Job::step runs runStep, which
// calls the placement's stages (train/placement/placement.h) in one order for every mode:
//
//   beginStep -> reduceGradients (+ the loss vote) -> squaredNorm -> [reducePartials]
//     -> judgeStep -> clip coefficient -> update (applied steps) -> endStep
//
// and, for a deferred GPU step, beginStep -> reduceGradients -> stepDeferred -> endStep.
// The norm is scale · sqrt(Σ g²) (PartialNorm); where the gradient is split over the ranks, the
// ranks' partial sums and loss ballots go through one reduction in rank order, so every rank gets
// the same bits and the same verdict. A whole-gradient placement's norm, judgement and update are
// one kOptimizer span of the timeline (a split placement records its own reduce and update spans).
//
// LossVote is the one vote: every lockstep placement exchanges the ranks' loss verdicts through it,
// either over a communicator (start before the gradient's reduction, finish after: a max
// all-reduce of one float, train/step/step_guard.h's LossVerdict ballots) or carried with the partial
// sums (reducePartials' max). Without an exchange (StepPlan::exchangeLoss false) the verdict is
// this rank's own.
// Thread safety: the training thread only. Collective where the placement's ranks step together.
#pragma once

#include <chrono>

#include "collectives/communicator.h"
#include "train/placement/placement.h"
#include "train/step.h"
#include "train/step/step_guard.h"

namespace cohort::train {

class LossVote {
 public:
  // This rank's ballot on `plan.loss`, as rank `rank` of `worldSize` ranks that vote.
  LossVote(const StepPlan& plan, int rank, int worldSize);
  LossVote(const LossVote&) = delete;
  LossVote& operator=(const LossVote&) = delete;

  // Starts the ballots' max all-reduce over `comm` (every rank of the vote); nothing when the plan
  // exchanges no loss.
  void start(collectives::Communicator& comm);
  // Waits (at most `timeout`) for the exchange start() began, if any, and takes its verdict.
  void finish(std::chrono::milliseconds timeout);
  // This rank's ballot, for a placement that carries it with its partial sums.
  double ballot() const { return ballot_; }
  // The largest ballot of the ranks, carried with the partial sums: the verdict, unless the plan
  // exchanges no loss or a communicator already carried the vote.
  void tally(double largestBallot);
  LossVerdict verdict() const { return verdict_; }
  // Started on a communicator and not finished.
  bool pending() const { return work_ != nullptr; }

 private:
  bool exchange_;
  bool settled_ = false;  // a communicator carried the vote
  int worldSize_;
  float ballot_;
  float exchanged_ = 0;  // all-reduced in place
  collectives::WorkPtr work_;
  LossVerdict verdict_;
};

// The step's verdict from the gradient's norm and the ranks' losses: a non-finite loss first, then a
// non-finite gradient (named by `gradientRank`, -1 for an average), then a loss spike, then a
// gradient norm above maxGradNorm (a spike).
StepResult judgeStep(double gradNorm, LossVerdict loss, int gradientRank, double maxGradNorm);

struct StepContext {
  int rank = 0;       // this rank, of
  int worldSize = 1;  // the ranks that vote (the world)
  Timeline& timeline;
};

// One step of `placement` as `plan` says (see the header comment).
StepResult runStep(Placement& placement, const StepPlan& plan, const StepContext& context);

}  // namespace cohort::train
