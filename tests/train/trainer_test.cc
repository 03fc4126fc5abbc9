// train::Trainer with callbacks, in process: onStepEnd sees every step, onEpochEnd's own figures
// reach the log and the metrics file, and a stop asked for by a callback ends the run at the same
// epoch on every rank (even when only rank 0 asks), with a checkpoint the run resumes from.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>

#include "nn/loss.h"
#include "nn/model_spec.h"
#include "nn/optimizer.h"
#include "tests/support/process.h"
#include "tests/train/ranks.h"
#include "train/job.h"
#include "train/trainer.h"

namespace cohort::train {
namespace {

using ipc::testing::ScopedShmDir;
using testing::runRanks;

std::string readAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

class TrainerTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = cohort::testing::freshTempDir(); }
  ScopedShmDir shm_;
  std::string dir_;
};

TEST_F(TrainerTest, CallbacksSeeEveryStepAddFiguresAndStopTheRunOnEveryRank) {
  const std::string metrics = dir_ + "/metrics.jsonl", ckpt = dir_ + "/stop.st";
  for (Mode mode : {Mode::kAllReduce, Mode::kHogwild}) {
    std::remove(metrics.c_str());
    runRanks(2, [&](const runtime::WorldInfo& world) {
      auto data = testing::teacherData();
      auto model = nn::buildModel("mlp:20,16,3");
      auto optimizer = nn::makeOptimizer({.lr = 0.05f, .momentum = 0.9f}, model->params.numel());
      Job job({.mode = mode}, world);
      job.place(*model, *optimizer, {.seed = 1});
      nn::SoftmaxCrossEntropy loss;
      int64_t steps = 0, lastStep = 0;
      TrainerCallbacks callbacks;
      callbacks.onStepEnd = [&](const StepReport& s) {
        ++steps;
        lastStep = s.step;
        return std::isfinite(s.loss) && s.samples == 16 ? Next::kContinue : Next::kStop;
      };
      callbacks.onEpochEnd = [&](EpochReport& e) {
        e.metrics.push_back({"doubled_loss", 2 * e.trainLoss});
        return world.rank == 0 && e.epoch == 2 ? Next::kStop : Next::kContinue;  // rank 0 alone asks
      };
      Trainer trainer(job, loss, *data, nullptr,
                      {.epochs = 5, .batchSize = 16, .seed = 2, .checkpointPath = ckpt, .metricsPath = metrics},
                      std::move(callbacks));
      TrainResult r = trainer.run();
      const int64_t perEpoch = trainer.loader().batchesPerEpoch();  // 384 / 2 / 16 = 12
      if (r.epochs != 2 || !r.stoppedByRequest) return 50;
      if (steps != 2 * perEpoch || lastStep != 2 * perEpoch || r.steps != lastStep) return 51;
      return 0;
    });
    const std::string text = readAll(metrics);
    EXPECT_NE(text.find("\"doubled_loss\""), std::string::npos) << text;
    EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 2) << text;
  }
}

}  // namespace
}  // namespace cohort::train
