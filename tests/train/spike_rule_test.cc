// The spike rule's pieces (train/step.h, "Spikes"): the history's limit (mean + z·max(sd, |mean|/100)
// of the last 128 values, none before 16), the loss votes the ranks reduce by max, and judgeStep's
// order (a non-finite value before a spike, the loss before the gradient).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "train/spike_detector.h"
#include "train/step/step_pipeline.h"

namespace cohort::train {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

TEST(SpikeDetectorTest, NoLimitBeforeTheHistory) {
  SpikeDetector d;
  for (size_t i = 0; i + 1 < kSpikeHistory; ++i) d.add(1.0 + static_cast<double>(i % 2));
  EXPECT_EQ(d.limit(3), kInf);
  d.add(1.0);
  EXPECT_LT(d.limit(3), kInf);
}

TEST(SpikeDetectorTest, MeanPlusZDeviations) {
  SpikeDetector d;
  // 16 values, alternately 1 and 3: mean 2, standard deviation 1.
  for (int i = 0; i < 16; ++i) d.add(i % 2 ? 3.0 : 1.0);
  EXPECT_DOUBLE_EQ(d.limit(5), 7.0);
  EXPECT_DOUBLE_EQ(d.limit(0.5), 2.5);
}

// A flat history: the deviation's floor is 1% of the mean, so a small wobble is not a spike.
TEST(SpikeDetectorTest, FlatHistoryHasAFloor) {
  SpikeDetector d;
  for (int i = 0; i < 20; ++i) d.add(4.0);
  EXPECT_DOUBLE_EQ(d.limit(5), 4.2);
}

// Only the last 128 values count: old large ones age out.
TEST(SpikeDetectorTest, WindowForgetsOldValues) {
  SpikeDetector d;
  for (int i = 0; i < 100; ++i) d.add(1000.0);
  for (size_t i = 0; i < kSpikeWindow; ++i) d.add(i % 2 ? 3.0 : 1.0);
  EXPECT_EQ(d.size(), kSpikeWindow);
  EXPECT_DOUBLE_EQ(d.limit(5), 7.0);
}

TEST(LossVerdictTest, VotesNameTheLowestRankNonFiniteFirst) {
  const int w = 4;
  auto vote = [&](bool finite, bool spike, int rank) {
    return LossVerdict::vote({.finite = finite, .spike = spike}, rank, w);
  };
  EXPECT_EQ(vote(true, false, 2), 0.0f);
  LossVerdict v = LossVerdict::ofVotes(std::max({vote(true, true, 3), vote(true, true, 1), vote(true, false, 0)}), w);
  EXPECT_EQ(v.spikeRank, 1);
  EXPECT_EQ(v.nonFiniteRank, -1);
  v = LossVerdict::ofVotes(std::max({vote(true, true, 0), vote(false, false, 3), vote(false, true, 2)}), w);
  EXPECT_EQ(v.nonFiniteRank, 2);
  EXPECT_EQ(v.spikeRank, -1);
  v = LossVerdict::ofVotes(0.0f, w);
  EXPECT_EQ(v.nonFiniteRank, -1);
  EXPECT_EQ(v.spikeRank, -1);
  // A non-finite loss is never also a spike.
  EXPECT_EQ(LossVerdict::own({.finite = false, .spike = true}, 3).spikeRank, -1);
}

TEST(JudgeStepTest, NonFiniteBeforeSpikesLossBeforeGradient) {
  StepResult r = judgeStep(5.0, {}, -1, 4.0);
  EXPECT_FALSE(r.applied);
  EXPECT_EQ(r.spike, Spike::kGradient);
  EXPECT_EQ(r.gradNormLimit, 4.0);
  EXPECT_EQ(r.nonFinite, NonFinite::kNone);
  r = judgeStep(5.0, {.spikeRank = 1}, -1, 4.0);
  EXPECT_EQ(r.spike, Spike::kLoss);
  EXPECT_EQ(r.rank, 1);
  r = judgeStep(kInf, {.spikeRank = 1}, -1, 4.0);
  EXPECT_EQ(r.nonFinite, NonFinite::kGradient);
  EXPECT_EQ(r.spike, Spike::kNone);
  r = judgeStep(4.0, {}, -1, 4.0);
  EXPECT_TRUE(r.applied);
  EXPECT_NE(judgeStep(5.0, {}, -1, 4.0).describe().find("spiked"), std::string::npos);
}

}  // namespace
}  // namespace cohort::train
