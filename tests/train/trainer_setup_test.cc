// What the Trainer checks when it is made (train/trainer_setup.cc), before any step: accuracy is
// reported only where it means something (inferred from the loss and the data; refused against mean
// squared error), the data's sample shape against the model (ModelInfo::sampleShape, then a batch
// through the network, naming the layer), the output against the targets, and ranks given different
// data refused with the fix (the same full data on every rank). Ranks are forked processes; each
// writes its error message, or its log, to a file the test reads.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "nn/linear.h"
#include "nn/loss.h"
#include "nn/model.h"
#include "nn/model_spec.h"
#include "nn/optimizer.h"
#include "nn/sequential.h"
#include "tests/support/process.h"
#include "tests/train/ranks.h"
#include "train/job.h"
#include "train/trainer.h"

namespace cohort::train {
namespace {

using ipc::testing::ScopedShmDir;
using runtime::Shape;
using testing::RankOutput;

std::string readAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// `n` samples of 20 features with `values` regression targets each (no classes).
std::unique_ptr<runtime::data::Dataset> regressionData(int64_t n = 96, int64_t values = 1) {
  std::vector<float> x(static_cast<size_t>(n * 20)), y(static_cast<size_t>(n * values));
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 7) / 8 - 0.375f;
  for (size_t i = 0; i < y.size(); ++i) y[i] = static_cast<float>(i % 5) / 4;
  return runtime::data::datasetFromArrays(
      {.name = "ramp", .inputs = x, .sampleShape = Shape{20}, .targets = y, .targetShape = Shape{values}});
}

// The same samples viewed as 8 features (a model of 20 does not take them).
std::unique_ptr<runtime::data::Dataset> narrowData(int64_t numClasses) {
  std::vector<float> x(64 * 8, 0.25f), y(64, 1.0f);
  return runtime::data::datasetFromArrays({.name = "narrow",
                                           .inputs = x,
                                           .sampleShape = Shape{8},
                                           .targets = y,
                                           .targetShape = Shape{},
                                           .numClasses = numClasses});
}

// MSE under another name: a user's own loss, which says nothing of accuracy.
class MyLoss final : public nn::Loss {
 public:
  std::string name() const override { return "my-loss"; }
  float forward(const runtime::Tensor& out, const runtime::Tensor& targets) override {
    return inner_.forward(out, targets);
  }
  const runtime::Tensor& backward() override { return inner_.backward(); }

 private:
  nn::MeanSquaredError inner_;
};

class TrainerSetupTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = cohort::testing::freshTempDir(); }

  std::vector<RankOutput> runAll(const std::string& name, int ranks,
                                 const std::function<void(const runtime::WorldInfo&)>& body) {
    return testing::runRanksCapturing(dir_ + "/" + name, ranks, body);
  }
  RankOutput run(const std::string& name, const std::function<void(const runtime::WorldInfo&)>& body) {
    return runAll(name, 1, body)[0];
  }

  ScopedShmDir shm_;
  std::string dir_;
};

// A model, its optimizer and a job, placed, on this rank; the trainer made from them trains.
struct Placed {
  Placed(std::unique_ptr<nn::Model> m, const runtime::WorldInfo& world)
      : job({.mode = world.isSingle() ? Mode::kLocal : Mode::kAllReduce}, world), model(std::move(m)) {
    optimizer = nn::makeOptimizer({.lr = 0.01f}, model->params.numel());
    job.place(*model, *optimizer, {.seed = 1});
  }
  Job job;
  std::unique_ptr<nn::Model> model;
  std::unique_ptr<nn::Optimizer> optimizer;
};

TEST_F(TrainerSetupTest, AccuracyIsReportedOnlyWhereItMeansSomething) {
  // A regression run with classification left unset: no train_acc, in the log or the metrics.
  for (const bool ownLoss : {false, true}) {
    SCOPED_TRACE(ownLoss ? "a loss of one's own on data without classes" : "MeanSquaredError");
    const std::string metrics = dir_ + "/regression" + (ownLoss ? "-own" : "") + ".jsonl";
    const auto [log, error] = run(ownLoss ? "own" : "mse", [&](const runtime::WorldInfo& world) {
      Placed p(nn::buildModel("mlp:20,8,1"), world);
      auto data = regressionData();
      nn::MeanSquaredError mse;
      MyLoss mine;
      Trainer trainer(p.job, ownLoss ? static_cast<nn::Loss&>(mine) : mse, *data, data.get(),
                      {.epochs = 2, .batchSize = 16, .metricsPath = metrics, .progressEverySeconds = 0});
      trainer.run();
    });
    EXPECT_EQ(error, "");
    EXPECT_EQ(cohort::testing::linesWith(log, " train_loss ").size(), 2u) << log;
    EXPECT_EQ(log.find("_acc"), std::string::npos) << log;
    EXPECT_NE(log.find(", no accuracy"), std::string::npos) << log;
    const std::string text = readAll(metrics);
    EXPECT_NE(text.find("\"train_loss\""), std::string::npos) << text;
    EXPECT_EQ(text.find("_acc"), std::string::npos) << text;
  }
  // Cross-entropy on classes: accuracy, without asking.
  const auto [log, error] = run("ce", [&](const runtime::WorldInfo& world) {
    Placed p(nn::buildModel("mlp:20,8,3"), world);
    auto data = testing::teacherData();
    nn::SoftmaxCrossEntropy loss;
    Trainer(p.job, loss, *data, data.get(), {.epochs = 1, .batchSize = 16, .progressEverySeconds = 0}).run();
  });
  EXPECT_EQ(error, "");
  EXPECT_NE(log.find(" train_acc "), std::string::npos) << log;
  EXPECT_NE(log.find(" test_acc "), std::string::npos) << log;
  // Asked for with a loss that counts no correct predictions: refused, naming the option.
  const std::string refused =
      run("refused", [&](const runtime::WorldInfo& world) {
        Placed p(nn::buildModel("mlp:20,8,1"), world);
        auto data = regressionData();
        nn::MeanSquaredError loss;
        Trainer trainer(p.job, loss, *data, nullptr, {.epochs = 1, .batchSize = 16, .classification = true});
      }).error;
  EXPECT_NE(refused.find("TrainerOptions::classification is true, but the loss MeanSquaredError counts no correct "
                         "predictions"),
            std::string::npos)
      << refused;
  EXPECT_NE(refused.find("leave classification unset"), std::string::npos) << refused;
}

// Each mistake is an InvalidArgument from the constructor (no step taken), naming both shapes.
TEST_F(TrainerSetupTest, DataTheModelCannotTakeIsRefusedWhenTheTrainerIsMade) {
  struct Case {
    std::string name;
    std::function<std::unique_ptr<nn::Model>()> model;
    bool trainOnTeacher;  // else on the narrow set
    bool narrowTest;
    std::vector<std::string> expected;
  };
  // A network of one's own that does not say what it takes (ModelInfo::sampleShape unset).
  auto unknownShape = [] {
    auto net = std::make_unique<nn::Sequential>();
    net->add(std::make_unique<nn::Linear>(20, 16), "fc0").add(std::make_unique<nn::Linear>(16, 3), "fc1");
    return std::make_unique<nn::Model>(std::move(net), nn::ModelInfo{.name = "mine"});
  };
  const std::vector<Case> cases = {
      {"declared",
       [] { return nn::buildModel("mlp:20,16,3"); },
       false,
       false,
       {"model mlp:20,16,3 takes samples of shape [20] (ModelInfo::sampleShape) but the training set narrow has "
        "samples of shape [8]; build the model for samples of shape [8], or give the training set narrow samples of "
        "shape [20] (datasetFromArrays' sampleShape)"}},
      {"layer",
       unknownShape,
       false,
       false,
       {"model mine cannot take the samples of shape [8] of the training set narrow (a batch of [16, 8]): layer fc0: "
        "Linear(20 -> 16) got input of shape [16, 8]"}},
      {"test",
       unknownShape,
       true,
       true,
       {"the test set narrow", "layer fc0: Linear(20 -> 16) got input of shape [16, 8]"}},
      {"classes",
       [] { return nn::buildModel("mlp:20,16,2"); },
       true,
       false,
       {"model mlp:20,16,2 gives outputs of shape [16, 2] for a batch of [16, 20], but the training set teacher has 3 "
        "classes: its last layer needs 3 outputs"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const auto [log, error] = run(c.name, [&](const runtime::WorldInfo& world) {
      Placed p(c.model(), world);
      auto teacher = testing::teacherData();
      auto narrow = narrowData(3);
      nn::SoftmaxCrossEntropy loss;
      Trainer trainer(p.job, loss, c.trainOnTeacher ? *teacher : *narrow, c.narrowTest ? narrow.get() : nullptr,
                      {.epochs = 1, .batchSize = 16});
      trainer.run();
    });
    for (const std::string& part : c.expected) EXPECT_NE(error.find(part), std::string::npos) << error;
    EXPECT_EQ(log.find("epoch 1/1"), std::string::npos) << "trained before checking\n" << log;
  }
  // Mean squared error: one output per target value.
  const auto [log, error] = run("targets", [&](const runtime::WorldInfo& world) {
    Placed p(nn::buildModel("mlp:20,8,1"), world);
    auto data = regressionData(96, 3);
    nn::MeanSquaredError loss;
    Trainer trainer(p.job, loss, *data, nullptr, {.epochs = 1, .batchSize = 16});
  });
  EXPECT_NE(error.find("model mlp:20,8,1 gives outputs of shape [16, 1] for a batch of [16, 20], but the training set "
                       "ramp has 3 target value(s) per sample"),
            std::string::npos)
      << error;
}

// Data seeded by rank (the mistake of a program that builds "its part"): every rank is refused at
// construction, and the message says what to do and where to read about it.
TEST_F(TrainerSetupTest, RanksGivenDifferentDataAreToldToBuildTheSameFullSet) {
  const std::vector<RankOutput> ranks = runAll("seeded", 2, [&](const runtime::WorldInfo& world) {
    Placed p(nn::buildModel("mlp:20,16,3"), world);
    auto data = testing::teacherData(384, 11 + static_cast<uint64_t>(world.rank));
    nn::SoftmaxCrossEntropy loss;
    Trainer trainer(p.job, loss, *data, nullptr, {.epochs = 1, .batchSize = 16});
    trainer.run();
  });
  for (const auto& [log, error] : ranks) {
    EXPECT_NE(error.find("were started with different settings: train_data_digest is "), std::string::npos) << error;
    EXPECT_NE(error.find("Every rank must build the same full training set"), std::string::npos) << error;
    EXPECT_NE(error.find("the Trainer gives each rank its shard of it"), std::string::npos) << error;
    EXPECT_NE(error.find("docs/api.md"), std::string::npos) << error;
    EXPECT_EQ(log.find("epoch 1/1"), std::string::npos) << log;
  }
}

}  // namespace
}  // namespace cohort::train
