// train::Trainer's evaluations and samples while training (TrainerOptions::evalEverySteps,
// evalBatches, sampleEverySteps; issue 47): on two ranks that share the evaluation, an "eval"
// metrics line at step 0 and every N steps, whose figures are the first evalBatches chunks'
// (train::evaluateChunks on them, bit for bit); samples are drawn on rank 0 alone, decoded token by
// token, and change no parameter.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "nn/loss.h"
#include "nn/model_spec.h"
#include "nn/optimizer.h"
#include "runtime/data/dataset.h"
#include "tests/support/process.h"
#include "tests/train/ranks.h"
#include "train/evaluate.h"
#include "train/job.h"
#include "train/trainer.h"

namespace cohort::train {
namespace {

using ipc::testing::ScopedShmDir;
using testing::runRanks;

class TrainerEvalTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = cohort::testing::freshTempDir(); }
  ScopedShmDir shm_;
  std::string dir_;
};

TEST_F(TrainerEvalTest, EvaluationsEveryNStepsCoverTheFirstBatchesOnEveryRank) {
  const std::string metrics = dir_ + "/metrics.jsonl";
  runRanks(2, [&](const runtime::WorldInfo& world) {
    auto train = testing::teacherData(), test = testing::teacherData(384, 12);
    auto model = nn::buildModel("mlp:20,16,3");
    auto optimizer = nn::makeOptimizer({.lr = 0.05f, .momentum = 0.9f}, model->params.numel());
    Job job({.mode = Mode::kAllReduce}, world);
    job.place(*model, *optimizer, {.seed = 1});
    nn::SoftmaxCrossEntropy loss;
    Trainer trainer(job, loss, *train, test.get(),
                    {.epochs = 1,
                     .batchSize = 16,
                     .seed = 2,
                     .metricsPath = metrics,
                     .evalBatchSize = 50,
                     .evalEverySteps = 5,
                     .evalBatches = 2});
    const TrainResult r = trainer.run();
    if (r.steps != 12) return 50;
    if (world.rank != 0) return 0;
    // The epoch's evaluation (step 12, the parameters at hand) covers the same first two chunks of
    // 50 as the evaluations at steps: against them, computed here, bit for bit.
    std::vector<double> sums(4, 0.0);
    evaluateChunks(*model, loss, *test, 50, 0, 2, sums);
    const Evaluation expected = evaluationOf(sums, 100, 1);
    return r.testLoss == expected.loss && r.testAcc == expected.accuracy ? 0 : 51;
  });
  std::ifstream in(metrics);
  std::vector<int64_t> steps;
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json j = nlohmann::json::parse(line);
    if (j.value("type", "") != "eval") continue;
    steps.push_back(j.at("step").get<int64_t>());
    EXPECT_EQ(j.at("test_samples"), 100) << line;
  }
  EXPECT_EQ(steps, (std::vector<int64_t>{0, 5, 10}));
}

// Byte windows of 8 for a byte GPT, from a text written in `dir`.
std::unique_ptr<runtime::data::Dataset> bytes(const std::string& dir) {
  std::string text;
  for (int i = 0; i < 100; ++i) text += "the cat sees a dog. ";
  std::ofstream(dir + "/text.txt") << text;
  return runtime::data::openDataset("text:" + dir + "/text.txt", runtime::data::Split::kTrain,
                                    {.context = 8, .seed = 1});
}

TEST_F(TrainerEvalTest, SamplesAreDecodedOnRankZeroAndChangeNoParameter) {
  std::vector<float> with, without;
  for (bool samples : {true, false}) {
    auto data = bytes(dir_);
    auto model = nn::buildModel("gpt:layers=1,heads=2,dim=16,ctx=8");
    auto optimizer = nn::makeOptimizer({.kind = nn::OptimizerKind::kAdamW, .lr = 0.01f}, model->params.numel());
    Job job({.mode = Mode::kLocal}, runtime::WorldInfo{});
    job.place(*model, *optimizer, {.seed = 3});
    nn::SoftmaxCrossEntropy loss;
    int decoded = 0;
    TrainerOptions o{.epochs = 1, .batchSize = 8, .seed = 4, .progressEverySeconds = 0};
    if (samples) {
      o.sampleEverySteps = 2;
      o.sampleTokens = 5;
      o.samplePrompt = {97, 98};
      o.sampleDecode = [&](int64_t id) {
        ++decoded;
        return std::string(1, static_cast<char>(id));
      };
    }
    Trainer trainer(job, loss, *data, nullptr, o);
    const int64_t steps = trainer.run().steps;
    EXPECT_GE(steps, 8);
    EXPECT_EQ(decoded, samples ? steps / 2 * 5 : 0) << "5 tokens every 2 steps";
    const runtime::Tensor& values = model->params.values();
    (samples ? with : without).assign(values.data(), values.data() + values.numel());
  }
  ASSERT_EQ(with.size(), without.size());
  EXPECT_EQ(std::memcmp(with.data(), without.data(), with.size() * sizeof(float)), 0);
}

TEST_F(TrainerEvalTest, SamplesNeedAGptAndAPromptInItsVocabulary) {
  auto data = bytes(dir_);
  auto model = nn::buildModel("gpt:layers=1,heads=2,dim=16,ctx=8");
  auto optimizer = nn::makeOptimizer({.lr = 0.01f}, model->params.numel());
  Job job({.mode = Mode::kLocal}, runtime::WorldInfo{});
  job.place(*model, *optimizer, {.seed = 3});
  nn::SoftmaxCrossEntropy loss;
  TrainerOptions o{.epochs = 1, .batchSize = 8, .sampleEverySteps = 2, .samplePrompt = {300}};
  try {
    Trainer trainer(job, loss, *data, nullptr, o);
    FAIL() << "a prompt id past the vocabulary was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("token 300, outside the vocabulary"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace cohort::train
