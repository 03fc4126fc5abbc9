// train::Trainer with callbacks, in process: onStepEnd sees every step, onEpochEnd's own figures
// reach the log and the metrics file, and a stop asked for by a callback ends the run at the same
// epoch on every rank (even when only rank 0 asks), with a checkpoint the run resumes from; a
// non-finite loss on one rank stops every rank at that step (Diverged) or is skipped by all of them,
// counted in the reports and the checkpoint.
#include "train/trainer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "nn/loss.h"
#include "nn/model_spec.h"
#include "nn/optimizer.h"
#include "tests/support/process.h"
#include "tests/train/ranks.h"
#include "train/evaluate.h"
#include "train/job.h"

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

// Cross-entropy whose loss value is NaN at chosen forward calls of one rank (its gradient stays
// finite): a non-finite loss the gradient check alone would not see.
class NanAt final : public nn::Loss {
 public:
  explicit NanAt(std::vector<int64_t> calls) : calls_(std::move(calls)) {}
  std::string name() const override { return "nan-at"; }
  float forward(const runtime::Tensor& out, const runtime::Tensor& targets) override {
    const float l = inner_.forward(out, targets);
    return std::find(calls_.begin(), calls_.end(), ++count_) != calls_.end() ? std::nanf("") : l;
  }
  const runtime::Tensor& backward() override { return inner_.backward(); }
  int64_t correct() const override { return inner_.correct(); }

 private:
  nn::SoftmaxCrossEntropy inner_;
  std::vector<int64_t> calls_;
  int64_t count_ = 0;
};

// Rank 1's loss is NaN at the 3rd batch each process trains (12 steps per epoch). Without skips both
// ranks stop at step 3 with Diverged naming rank 1's loss, and write no checkpoint; with 2 allowed
// both skip step 3 of epoch 1 and checkpoint, and the run resumed for epoch 2 skips its step 15:
// 1 skip in each epoch's report, 2 in the run's count, which the checkpoint carried over.
TEST_F(TrainerTest, ANonFiniteLossStopsEveryRankAtItsStepOrIsSkippedByAll) {
  const std::string metrics = dir_ + "/skips.jsonl", ckpt = dir_ + "/skips.st";
  auto body = [&](int64_t skips, int64_t epochs) {
    return [=](const runtime::WorldInfo& world) {
      auto data = testing::teacherData();
      auto model = nn::buildModel("mlp:20,16,3");
      auto optimizer = nn::makeOptimizer({.lr = 0.05f, .momentum = 0.9f}, model->params.numel());
      Job job({.mode = Mode::kAllReduce}, world);
      job.place(*model, *optimizer, {.seed = 1});
      NanAt loss(world.rank == 1 ? std::vector<int64_t>{3} : std::vector<int64_t>{});
      int64_t skippedSeen = 0;
      TrainerCallbacks callbacks;
      callbacks.onStepEnd = [&](const StepReport& s) {
        if (!s.applied) ++skippedSeen;
        return Next::kContinue;
      };
      callbacks.onEpochEnd = [&](EpochReport& e) { return e.skippedSteps == 1 ? Next::kContinue : Next::kStop; };
      Trainer trainer(job, loss, *data, nullptr,
                      {.epochs = epochs,
                       .batchSize = 16,
                       .seed = 2,
                       .checkpointPath = ckpt,
                       .resume = true,
                       .metricsPath = metrics,
                       .skipNonFinite = skips},
                      std::move(callbacks));
      try {
        TrainResult r = trainer.run();
        if (skips == 0) return 60;
        if (r.stoppedEarly || r.skippedSteps != (epochs == 1 ? 1 : 2)) return 61;
        return 0;
      } catch (const Diverged& e) {
        const std::string m = e.what();
        // Issue 33: no checkpoint was written before step 3, so the message must not name one as kept.
        if (skips != 0 || m.find("step 3 ") == std::string::npos ||
            m.find("loss is non-finite on rank 1") == std::string::npos ||
            m.find("holds the last checkpoint") != std::string::npos ||
            m.find("nothing was checkpointed") == std::string::npos) {
          std::fprintf(stderr, "%s\n", m.c_str());
          return 62;
        }
        return skippedSeen == 0 ? 0 : 63;
      }
    };
  };
  runRanks(2, body(0, 2));
  EXPECT_FALSE(std::ifstream(ckpt).good()) << "a checkpoint was written by a run that diverged before its first";
  runRanks(2, body(2, 1));  // epoch 1: skips step 3, checkpoints
  runRanks(2, body(2, 2));  // resumed: epoch 2 skips step 15 (the count says 2 in all)
  const std::string text = readAll(metrics);
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 2) << text;
  size_t at = 0, lines = 0;
  while ((at = text.find("\"skipped_steps\":1", at)) != std::string::npos) ++lines, ++at;
  EXPECT_EQ(lines, 2u) << text;
}

// Counts its forward calls (training batches and evaluation chunks alike).
class CountingLoss final : public nn::Loss {
 public:
  std::string name() const override { return "counting"; }
  float forward(const runtime::Tensor& out, const runtime::Tensor& targets) override {
    ++calls;
    return inner_.forward(out, targets);
  }
  const runtime::Tensor& backward() override { return inner_.backward(); }
  int64_t correct() const override { return inner_.correct(); }
  int64_t calls = 0;

 private:
  nn::SoftmaxCrossEntropy inner_;
};

// The test set's evaluation is split over the ranks that all hold it (chunks of 50 of 300: 6, three
// each) and gives rank 0 exactly the figures it computes alone, with replicas as with the shared
// copy (the job's one reduce: raw doubles gathered, added in rank order); with the test set on rank 0
// only, rank 0 evaluates alone; with 7 chunks on 2 ranks, 3 and 4. The ranks hold the same
// parameters, so rank 0's own evaluation after the run is the reference.
TEST_F(TrainerTest, TheRanksShareTheTestSetsEvaluationExactly) {
  struct Case {
    int64_t testSize;
    bool everyRank;
    int64_t rank1Chunks;  // evaluation forwards rank 1 makes
  };
  for (const Case c : {Case{300, true, 3}, Case{350, true, 4}, Case{300, false, 0}}) {
    for (bool replicas : {true, false}) {
      SCOPED_TRACE((replicas ? "replicas, test size " : "shared, test size ") + std::to_string(c.testSize));
      runRanks(2, [&](const runtime::WorldInfo& world) {
        auto data = testing::teacherData();
        auto test = testing::teacherData(c.testSize, 12);
        auto model = nn::buildModel("mlp:20,16,3");
        auto optimizer = nn::makeOptimizer({.lr = 0.05f, .momentum = 0.9f}, model->params.numel());
        Job job(
            {.mode = Mode::kAllReduce, .paramCopies = replicas ? ParamCopies::kReplicas : ParamCopies::kSharedPerNode},
            world);
        job.place(*model, *optimizer, {.seed = 1});
        CountingLoss loss;
        const bool holds = c.everyRank || world.rank == 0;
        Trainer trainer(job, loss, *data, holds ? test.get() : nullptr,
                        {.epochs = 1, .batchSize = 16, .seed = 2, .evalBatchSize = 50});
        const TrainResult r = trainer.run();
        const int64_t evaluations = loss.calls - trainer.loader().batchesPerEpoch();
        if (world.rank == 1) return r.haveTest ? 70 : evaluations == c.rank1Chunks ? 0 : 71;
        const Evaluation alone = trainer.evaluate(*test);
        if (!r.haveTest || r.testLoss != alone.loss || r.testAcc != alone.accuracy) {
          std::fprintf(stderr, "test %.17g %.17g, alone %.17g %.17g\n", r.testLoss, r.testAcc, alone.loss,
                       alone.accuracy);
          return 72;
        }
        return 0;
      });
    }
  }
}

// Evaluation chunks: at most kEvaluationLogitBytes of outputs, and a language model's at most
// kEvaluationPositions positions (at least one window); otherwise what was asked.
TEST(EvaluationChunk, BoundsALanguageModelsPositions) {
  EXPECT_EQ(evaluationChunk(*nn::buildModel("mlp:784,16,10"), 1000), 1000);
  EXPECT_EQ(evaluationChunk(*nn::buildModel("gpt:layers=1,heads=1,dim=8,ctx=64"), 1000), kEvaluationPositions / 64);
  EXPECT_EQ(evaluationChunk(*nn::buildModel("gpt:layers=1,heads=1,dim=8,ctx=64"), 10), 10);
  EXPECT_EQ(evaluationChunk(*nn::buildModel("gpt:layers=1,heads=1,dim=8,ctx=8192"), 1000), 1);
  // GPT-2's vocabulary: 64 MiB of logits (12.9 MB a window of 64), not 4096 positions (64 windows).
  EXPECT_EQ(evaluationChunk(*nn::buildModel("gpt:layers=1,heads=1,dim=8,ctx=64,vocab=50257"), 1000),
            kEvaluationLogitBytes / (64 * 50257 * 4));
  EXPECT_EQ(evaluationChunk(*nn::buildModel("gpt:layers=1,heads=1,dim=8,ctx=64,vocab=50257"), 1000), 5);
  EXPECT_EQ(evaluationChunk(*nn::buildModel("gpt:layers=1,heads=1,dim=8,ctx=1024,vocab=50257"), 1000), 1);
  EXPECT_EQ(evaluationChunk(*nn::buildModel("mlp:4,100000"), 1000), kEvaluationLogitBytes / 400000);
}

}  // namespace
}  // namespace cohort::train
