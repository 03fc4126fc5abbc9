// What the Trainer logs (train/trainer_log.cc) and the throughput it reports: rank 0 alone writes
// the start-up line and the epoch lines unless every rank is asked to; the start-up line names the
// model, its parameters, the mode, the world and the effective batch; samplesPerSecSteady leaves out
// the first epoch, which samplesPerSec includes. Ranks are forked processes whose stdout the test
// reads.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <string>
#include <thread>
#include <vector>

#include "nn/loss.h"
#include "nn/model_spec.h"
#include "nn/optimizer.h"
#include "tests/support/process.h"
#include "tests/train/ranks.h"
#include "train/job.h"
#include "train/trainer.h"

namespace cohort::train {
namespace {

using cohort::testing::linesWith;
using ipc::testing::ScopedShmDir;
using testing::RankOutput;

class TrainerLogTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = cohort::testing::freshTempDir(); }

  // Two epochs of the teacher task on `ranks` ranks in allreduce, with `options`' logging.
  std::vector<RankOutput> train(const std::string& name, int ranks, const TrainerOptions& options) {
    return testing::runRanksCapturing(dir_ + "/" + name, ranks, [&](const runtime::WorldInfo& world) {
      auto data = testing::teacherData();
      auto model = nn::buildModel("mlp:20,16,3");
      auto optimizer = nn::makeOptimizer({.lr = 0.05f}, model->params.numel());
      Job job({.mode = Mode::kAllReduce}, world);
      job.place(*model, *optimizer, {.seed = 1});
      nn::SoftmaxCrossEntropy loss;
      Trainer(job, loss, *data, data.get(), options).run();
    });
  }

  ScopedShmDir shm_;
  std::string dir_;
};

TEST_F(TrainerLogTest, RankZeroAloneLogsUnlessEveryRankIsAsked) {
  const TrainerOptions options{.epochs = 2, .batchSize = 16, .accumulateSteps = 2, .progressEverySeconds = 0};
  const std::vector<RankOutput> byDefault = train("default", 2, options);
  for (const RankOutput& r : byDefault) EXPECT_EQ(r.error, "");
  const std::string& zero = byDefault[0].log;
  EXPECT_EQ(linesWith(zero, " train_loss ").size(), 2u) << zero;
  EXPECT_EQ(linesWith(byDefault[1].log, " train_loss ").size(), 0u) << byDefault[1].log;
  // One start-up line, before the first epoch's: mlp:20,16,3 has 20·16 + 16 + 16·3 + 3 = 387
  // parameters; 384 samples over 2 ranks in batches of 16, 2 per step: 6 steps per epoch.
  const std::vector<std::string> start = linesWith(zero, "training ");
  ASSERT_EQ(start.size(), 1u) << zero;
  EXPECT_NE(start[0].find(
                "training mlp:20,16,3 (387 parameters) on teacher (384 samples, 192 per rank and epoch; test "
                "384): allreduce on 2 ranks, batch 16 per rank, 2 micro-batches a step, effective batch 64 (2 ranks "
                "x 2 x 16), 6 steps per epoch, 2 epochs, accuracy reported"),
            std::string::npos)
      << start[0];
  EXPECT_LT(zero.find("training "), zero.find(" train_loss ")) << zero;
  EXPECT_EQ(byDefault[1].log.find("training "), std::string::npos) << byDefault[1].log;

  TrainerOptions everyRank = options;
  everyRank.logRanks = LogRanks::kEveryRank;
  everyRank.logStartLine = false;
  const std::vector<RankOutput> all = train("every", 2, everyRank);
  for (const RankOutput& r : all) {
    EXPECT_EQ(r.error, "");
    EXPECT_EQ(linesWith(r.log, " train_loss ").size(), 2u) << r.log;
    EXPECT_EQ(r.log.find("training "), std::string::npos) << r.log;
  }
}

// The first epoch is slowed (a callback sleeps in each of its steps, as a cold start would): the
// run's samplesPerSec includes it, samplesPerSecSteady is the later epochs' samples over their time.
TEST_F(TrainerLogTest, TheSteadyRateLeavesOutTheFirstEpoch) {
  std::vector<RankOutput> out = testing::runRanksCapturing(dir_ + "/steady", 1, [&](const runtime::WorldInfo& world) {
    auto data = testing::teacherData();
    auto model = nn::buildModel("mlp:20,16,3");
    auto optimizer = nn::makeOptimizer({.lr = 0.05f}, model->params.numel());
    Job job({}, world);
    job.place(*model, *optimizer, {.seed = 1});
    nn::SoftmaxCrossEntropy loss;
    std::vector<double> epochRates;
    TrainerCallbacks callbacks;
    callbacks.onStepEnd = [](const StepReport& s) {
      if (s.epoch == 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
      return Next::kContinue;
    };
    callbacks.onEpochEnd = [&](EpochReport& e) {
      epochRates.push_back(e.epochSamplesPerSec);
      return Next::kContinue;
    };
    const TrainResult r =
        Trainer(job, loss, *data, nullptr, {.epochs = 3, .batchSize = 32, .progressEverySeconds = 0}, callbacks).run();
    // One rank, 384 samples an epoch: the later epochs' rate is the harmonic mean of theirs.
    const double later = 2 / (1 / epochRates.at(1) + 1 / epochRates.at(2));
    if (std::fabs(r.samplesPerSecSteady - later) > 1e-9 * later) {
      throw std::runtime_error("steady " + std::to_string(r.samplesPerSecSteady) + ", epochs 2 and 3 " +
                               std::to_string(later));
    }
    // 12 steps of 10 ms at least in the first epoch: well below the later epochs' rate.
    if (!(r.samplesPerSec < 0.8 * r.samplesPerSecSteady)) {
      throw std::runtime_error("the run's " + std::to_string(r.samplesPerSec) + " samples/s is not below the steady " +
                               std::to_string(r.samplesPerSecSteady));
    }
    const TrainResult one =
        Trainer(job, loss, *data, nullptr, {.epochs = 1, .batchSize = 32, .progressEverySeconds = 0}).run();
    if (one.samplesPerSecSteady != one.samplesPerSec) throw std::runtime_error("one epoch: not the run's rate");
  });
  EXPECT_EQ(out[0].error, "");
}

}  // namespace
}  // namespace cohort::train
