// train::Trainer on a GPU (tags = ["gpu"]; skips with the reason when no CUDA device is usable):
// token ids a GPU Embedding cannot refuse in forward (it gives NaN rows) are named as the CPU names
// them, InvalidArgument with the position and value, not reported as a diverged step, both in
// training and in the evaluation.
#include <gtest/gtest.h>

#include <string>

#include "nn/loss.h"
#include "nn/model_spec.h"
#include "nn/optimizer.h"
#include "runtime/data/dataset.h"
#include "runtime/error.h"
#include "tests/runtime/cuda/gpu_test_util.h"
#include "train/job.h"
#include "train/trainer.h"

namespace cohort::train {
namespace {

using runtime::Shape;
using runtime::Tensor;

// 16 windows of 4 ids below 6, but for window `badWindow`, whose position 2 holds 9.
runtime::data::Dataset ids(int64_t badWindow) {
  runtime::data::DatasetContents c{.name = "ids", .inputs = Tensor::zeros(Shape{16, 4}), .targets = Tensor::zeros(Shape{16, 4}),
                                   .numClasses = 6};
  for (int64_t i = 0; i < 64; ++i) {
    c.inputs.at(i) = static_cast<float>(i % 6);
    c.targets.at(i) = static_cast<float>((i + 1) % 6);
  }
  if (badWindow >= 0) c.inputs.at(badWindow * 4 + 2) = 9;
  return runtime::data::Dataset(std::move(c));
}

std::string trainAndReport(const runtime::data::Dataset& train, const runtime::data::Dataset* test) {
  Job job({.device = "cuda"}, runtime::WorldInfo{});  // first: the model's tensors are of its allocator
  auto model = nn::buildModel("gpt:layers=1,heads=1,dim=8,ctx=4,vocab=6");
  auto optimizer = nn::makeOptimizer({.kind = nn::OptimizerKind::kAdamW, .lr = 0.01f}, model->params.numel(), job.gpu());
  job.place(*model, *optimizer, {.seed = 1});
  nn::SoftmaxCrossEntropy loss;
  Trainer trainer(job, loss, train, test, {.epochs = 1, .batchSize = 4, .seed = 2});
  try {
    trainer.run();
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "no error";
}

TEST(TrainerGpu, BadTokenIdsAreNamedInTrainingAndEvaluation) {
  COHORT_SKIP_WITHOUT_CUDA_DEVICE();
  const runtime::data::Dataset good = ids(-1), badTrain = ids(5), badTest = ids(11);
  EXPECT_EQ(trainAndReport(good, &good), "no error");
  const std::string inTraining = trainAndReport(badTrain, nullptr);
  EXPECT_NE(inTraining.find("is 9"), std::string::npos) << inTraining;
  const std::string inEvaluation = trainAndReport(good, &badTest);
  EXPECT_NE(inEvaluation.find("position 46 "), std::string::npos) << inEvaluation;  // window 11, position 2
  EXPECT_NE(inEvaluation.find("is 9"), std::string::npos) << inEvaluation;
}

}  // namespace
}  // namespace cohort::train
