// runStep: the one pipeline calls a placement's stages in one order — begin, reduce (with the vote),
// norm, the partial sums' reduction only where the gradient is split, update only when applied, end
// always — and judges from the norm and the vote it reduced. A fake placement records the calls.
#include "train/step/step_pipeline.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

namespace cohort::train {
namespace {

class RecordingPlacement final : public Placement {
 public:
  RecordingPlacement(bool split, double squares, double othersSquares = 0, double othersBallot = 0)
      : split_(split), squares_(squares), othersSquares_(othersSquares), othersBallot_(othersBallot) {}

  std::unique_ptr<JobCollectives> makeCollectives() override { return std::make_unique<LocalCollectives>(); }
  SavedState saveState() override { return {}; }
  void loadState(const CheckpointReader&) override {}

  void beginStep(const StepPlan&) override { calls.push_back("begin"); }
  void reduceGradients(const StepPlan&, LossVote&) override { calls.push_back("reduce"); }
  PartialNorm squaredNorm(const StepPlan& plan) override {
    calls.push_back("norm");
    return {.squares = squares_, .scale = split_ ? 1.0f : plan.gradScale};
  }
  bool splitsGradient() const override { return split_; }
  // Another rank's (sum, ballot) joins this one's, in rank order.
  void reducePartials(std::span<double, 2> sumAndBallot) override {
    calls.push_back("partials");
    sumAndBallot[0] += othersSquares_;
    sumAndBallot[1] = std::max(sumAndBallot[1], othersBallot_);
  }
  int gradientRank() const override { return -1; }
  void update(const StepPlan&, float clip) override {
    calls.push_back("update");
    clips.push_back(clip);
  }
  void endStep(const StepResult& result) override { calls.push_back(result.applied ? "end applied" : "end skipped"); }

  std::vector<std::string> calls;
  std::vector<float> clips;

 private:
  bool split_;
  double squares_, othersSquares_, othersBallot_;
};

std::string joined(const std::vector<std::string>& calls) {
  std::string s;
  for (const auto& c : calls) s += (s.empty() ? "" : ", ") + c;
  return s;
}

TEST(StepPipeline, AWholeGradientIsMeasuredJudgedAndUpdatedInOrder) {
  StepGuard guard(nullptr, std::chrono::seconds(5));
  Timeline timeline;
  RecordingPlacement p(false, 16.0);
  const StepResult r = runStep(p, {.gradScale = 0.5f, .clipGradNorm = 1.0f, .guard = &guard}, {.timeline = timeline});
  EXPECT_EQ(joined(p.calls), "begin, reduce, norm, update, end applied");
  EXPECT_EQ(r.gradNorm, 2.0);  // 0.5 * sqrt(16)
  ASSERT_EQ(p.clips.size(), 1u);
  EXPECT_LT(p.clips[0], 1.0f);  // clipped to norm 1
}

TEST(StepPipeline, ASplitGradientReducesItsPartialSumsOnceThenUpdatesItsPart) {
  StepGuard guard(nullptr, std::chrono::seconds(5));
  Timeline timeline;
  RecordingPlacement p(true, 9.0, 16.0);
  const StepResult r = runStep(p, {.guard = &guard}, {.rank = 0, .worldSize = 2, .timeline = timeline});
  EXPECT_EQ(joined(p.calls), "begin, reduce, norm, partials, update, end applied");
  EXPECT_EQ(r.gradNorm, 5.0);  // sqrt(9 + 16)
  EXPECT_EQ(p.clips, std::vector<float>{1.0f});
}

TEST(StepPipeline, ASkippedStepUpdatesNothingButEndsTheStep) {
  StepGuard guard(nullptr, std::chrono::seconds(5));
  Timeline timeline;
  RecordingPlacement whole(false, std::nan(""));
  StepResult r = runStep(whole, {.guard = &guard}, {.timeline = timeline});
  EXPECT_EQ(joined(whole.calls), "begin, reduce, norm, end skipped");
  EXPECT_EQ(r.nonFinite, NonFinite::kGradient);
  // The other rank's ballot says its loss spiked (ballot W - rank = 1 for rank 1 of 2): every rank
  // learns it from the partial sums' reduction.
  RecordingPlacement split(true, 1.0, 1.0, 1.0);
  r = runStep(split, {.loss = {.finite = true}, .exchangeLoss = true, .guard = &guard},
              {.rank = 0, .worldSize = 2, .timeline = timeline});
  EXPECT_EQ(joined(split.calls), "begin, reduce, norm, partials, end skipped");
  EXPECT_EQ(r.spike, Spike::kLoss);
  EXPECT_EQ(r.rank, 1);
}

TEST(LossVote, WithoutAnExchangeTheVerdictIsThisRanksOwn) {
  LossVote vote({.loss = {.finite = false}}, 1, 2);
  EXPECT_EQ(vote.verdict().nonFiniteRank, 1);
  vote.tally(0.0);  // nothing exchanged: the ballots do not count
  EXPECT_EQ(vote.verdict().nonFiniteRank, 1);
  LossVote exchanged({.loss = {.finite = true}, .exchangeLoss = true}, 0, 3);
  exchanged.tally(LossVerdict::vote({.finite = false}, 2, 3));
  EXPECT_EQ(exchanged.verdict().nonFiniteRank, 2);
}

}  // namespace
}  // namespace cohort::train
