// The training step's CUDA graph (train/step_graph.h, TrainerOptions::cudaGraphs; tags = ["gpu"]: the
// emulated device in CI). A run whose forward and backward are captured once and replayed ends bit
// for bit where the uncaptured run ends (parameters, optimizer state, every epoch's train and test
// loss, with evaluations between steps), in fp32 and bf16, with the epoch's partial last batch run
// uncaptured; a step that draws random numbers on the host (dropout) cannot be replayed, so the
// capture is discarded, the run falls back with one line naming the reason, and it still ends where
// the uncaptured run ends; a loss of one's own is not captured, and says so.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "nn/loss.h"
#include "nn/model_spec.h"
#include "nn/optimizer.h"
#include "runtime/data/data_loader.h"
#include "runtime/data/dataset.h"
#include "runtime/dtype.h"
#include "tests/runtime/cuda/gpu_test_util.h"
#include "train/job.h"
#include "train/trainer.h"

namespace cohort::train {
namespace {

using runtime::Shape;
using runtime::Tensor;

// `windows` windows of 4 token ids below 6.
runtime::data::Dataset ids(int64_t windows, int64_t offset) {
  runtime::data::DatasetContents c{.name = "ids",
                                   .inputs = Tensor::zeros(Shape{windows, 4}),
                                   .targets = Tensor::zeros(Shape{windows, 4}),
                                   .numClasses = 6};
  for (int64_t i = 0; i < windows * 4; ++i) {
    c.inputs.at(i) = static_cast<float>((i * 5 + offset) % 6);
    c.targets.at(i) = static_cast<float>((i * 5 + offset + 1) % 6);
  }
  return runtime::data::Dataset(std::move(c));
}

std::vector<float> toHost(const Tensor& t) {
  Tensor host = Tensor::zeros(t.shape());
  host.copyFrom(t);
  return std::vector<float>(host.data(), host.data() + host.numel());
}

struct RunEnd {
  std::vector<float> values;       // parameters, then the optimizer's state
  std::vector<double> losses;      // each epoch's train loss and test loss
  TrainResult result;
};

struct RunOptions {
  std::string model = "gpt:layers=1,heads=2,dim=8,ctx=4,vocab=6";
  runtime::DType precision = runtime::DType::kF32;
  bool cudaGraphs = true;
  bool ownLoss = false;
};

// A loss of one's own: Cohort's cross-entropy under another type.
class OwnLoss final : public nn::Loss {
 public:
  std::string name() const override { return "own"; }
  float forward(const Tensor& out, const Tensor& targets) override { return inner_.forward(out, targets); }
  void forwardGpu(const Tensor& out, const Tensor& targets, runtime::cuda::GpuContext& gpu) override {
    inner_.forwardGpu(out, targets, gpu);
  }
  const Tensor& backward() override { return inner_.backward(); }
  int64_t correct() const override { return inner_.correct(); }

 private:
  nn::SoftmaxCrossEntropy inner_;
};

// 2 epochs of 18 windows in batches of 4: 4 full batches and one of 2 an epoch; an evaluation every
// 3 steps between them.
RunEnd train(const RunOptions& o) {
  Job job({.device = "cuda", .precision = o.precision}, runtime::WorldInfo{});
  auto model = nn::buildModel(o.model);
  auto optimizer =
      nn::makeOptimizer({.kind = nn::OptimizerKind::kAdamW, .lr = 0.01f, .weightDecay = 0.1f}, model->params.numel(), job.gpu());
  job.place(*model, *optimizer, {.seed = 1});
  nn::SoftmaxCrossEntropy crossEntropy;
  OwnLoss own;
  const runtime::data::Dataset data = ids(18, 0), test = ids(6, 1);
  RunEnd end;
  TrainerCallbacks callbacks{.onEpochEnd = [&](EpochReport& r) {
    end.losses.push_back(r.trainLoss);
    end.losses.push_back(r.testLoss);
    return Next::kContinue;
  }};
  Trainer trainer(job, o.ownLoss ? static_cast<nn::Loss&>(own) : crossEntropy, data, &test,
                  {.epochs = 2, .batchSize = 4, .seed = 2, .evalEverySteps = 3, .clipGradNorm = 1.0f,
                   .progressEverySeconds = 0, .cudaGraphs = o.cudaGraphs},
                  callbacks);
  end.result = trainer.run();
  end.values = toHost(model->params.values());
  for (const auto& s : optimizer->state()) {
    const std::vector<float> state = toHost(s.tensor);
    end.values.insert(end.values.end(), state.begin(), state.end());
  }
  return end;
}

// The parameters, the optimizer state and the losses bit for bit (the loss kernel adds its rows' sums
// in a fixed order: runtime/cuda/cross_entropy_kernels.cu).
void expectSameEnd(const RunEnd& a, const RunEnd& b, bool compareLosses = true) {
  ASSERT_EQ(a.values.size(), b.values.size());
  size_t differ = 0;
  for (size_t i = 0; i < a.values.size(); ++i) differ += std::memcmp(&a.values[i], &b.values[i], sizeof(float)) != 0;
  EXPECT_EQ(differ, 0u) << "of " << a.values.size() << " values";
  EXPECT_EQ(a.result.steps, b.result.steps);
  if (!compareLosses) return;
  ASSERT_EQ(a.losses.size(), 4u);
  ASSERT_EQ(a.losses.size(), b.losses.size());
  for (size_t i = 0; i < a.losses.size(); ++i) EXPECT_EQ(a.losses[i], b.losses[i]) << i;
}

// Epoch 1: batch 1 eager (the warm-up), batch 2 captured, 3 and 4 replayed, the partial batch 5
// eager; epoch 2: batches 1–4 replayed, 5 eager. 7 graph steps of 10.
TEST(StepGraphGpu, ReplayedStepsEndBitForBitWhereUncapturedStepsEnd) {
  COHORT_SKIP_WITHOUT_CUDA_DEVICE();
  for (runtime::DType precision : {runtime::DType::kF32, runtime::DType::kBF16}) {
    SCOPED_TRACE(runtime::dtypeName(precision));
    const RunEnd uncaptured = train({.precision = precision, .cudaGraphs = false});
    const RunEnd graphs = train({.precision = precision});
    EXPECT_EQ(uncaptured.result.cudaGraphSteps, 0);
    EXPECT_EQ(graphs.result.cudaGraphSteps, 7);
    EXPECT_EQ(graphs.result.cudaGraphsOff, "");
    EXPECT_EQ(graphs.result.steps, 10);
    expectSameEnd(graphs, uncaptured);
  }
}

// 24 steps of an MLP under squared error with AdamW over nanoGPT's groups (decay on the weights
// only), a warm-up then cosine learning rate (a new lr every step), clipping, one sample with a NaN
// (its step is skipped) and one 1000 times the others (a gradient spike once 16 steps are applied).
struct GuardedRun {
  RunEnd end;
  std::vector<double> gradNorms;  // each step's, from the device's record (NaN for the skipped one)
  std::vector<bool> applied;
  double testLoss = 0;
};

GuardedRun trainGuarded(bool cudaGraphs, bool synchronousSteps) {
  Job job({.device = "cuda"}, runtime::WorldInfo{});
  auto model = nn::buildModel("mlp:4,8,2");
  auto optimizer = nn::makeOptimizer({.kind = nn::OptimizerKind::kAdamW,
                                      .lr = 0.01f,
                                      .weightDecay = 0.1f,
                                      .groups = nn::decayMatricesOnly(model->params, 0.1f)},
                                     model->params.numel(), job.gpu());
  job.place(*model, *optimizer, {.seed = 1});
  runtime::data::DatasetContents c{.name = "line", .inputs = Tensor::zeros(Shape{48, 4}), .targets = Tensor::zeros(Shape{48, 2})};
  for (int64_t i = 0; i < 48 * 4; ++i) c.inputs.at(i) = static_cast<float>((i * 7) % 11 - 5) / 8;
  for (int64_t i = 0; i < 48 * 2; ++i) c.targets.at(i) = static_cast<float>((i * 3) % 5 - 2) / 4;
  // The samples the shuffled epoch trains on at steps 11 (NaN) and 21 (the spike: 20 applied before).
  const std::vector<int64_t> order = runtime::data::epochOrder(48, {.batchSize = 2, .seed = 3}, 0);
  c.inputs.at(4 * order[2 * 10] + 1) = std::nanf("");
  for (int64_t k = 0; k < 4; ++k) c.inputs.at(4 * order[2 * 20] + k) *= 1000;
  runtime::data::DatasetContents t{.name = "test", .inputs = c.inputs.clone(), .targets = c.targets.clone()};
  for (int64_t i = 0; i < 48 * 4; ++i) t.inputs.at(i) = static_cast<float>((i * 5) % 11 - 5) / 8;
  const runtime::data::Dataset data(std::move(c)), test(std::move(t));
  nn::MeanSquaredError loss;
  GuardedRun run;
  TrainerCallbacks callbacks{.onStepEnd =
                                 [&](const StepReport& r) {
                                   run.gradNorms.push_back(r.gradNorm);
                                   run.applied.push_back(r.applied);
                                   return Next::kContinue;
                                 },
                             .onEpochEnd =
                                 [&](EpochReport& r) {
                                   run.testLoss = r.testLoss;
                                   return Next::kContinue;
                                 }};
  Trainer trainer(job, loss, data, &test,
                  {.epochs = 1, .batchSize = 2, .seed = 3,
                   .lrSchedule = nn::LrScheduleOptions{.kind = nn::LrScheduleKind::kCosine, .baseLr = 0.01,
                                                       .warmupSteps = 4, .totalSteps = 24, .minLr = 0.001},
                   .clipGradNorm = 0.5f, .skipNonFinite = 1, .skipSpikes = 3, .progressEverySeconds = 0,
                   .synchronousSteps = synchronousSteps, .cudaGraphs = cudaGraphs},
                  callbacks);
  run.end.result = trainer.run();
  run.end.values = toHost(model->params.values());
  for (const auto& s : optimizer->state()) {
    const std::vector<float> state = toHost(s.tensor);
    run.end.values.insert(run.end.values.end(), state.begin(), state.end());
  }
  return run;
}

// The deferred step's device work is captured with the forward and backward: the graph holds four
// nodes more than the synchronous run's (Σ g²'s two kernels, the judge, and the optimizer's one
// multi-tensor kernel for all of the groups' runs), and the replayed steps — whose judge options,
// learning rates and bias corrections change every step — end bit for bit where the uncaptured run
// ends, the skipped NaN step and the spike included.
TEST(StepGraphGpu, TheGuardedOptimizerStepReplaysInsideTheGraph) {
  COHORT_SKIP_WITHOUT_CUDA_DEVICE();
  const GuardedRun uncaptured = trainGuarded(false, false);
  const GuardedRun graphs = trainGuarded(true, false);
  const GuardedRun synchronous = trainGuarded(true, true);
  EXPECT_EQ(uncaptured.end.result.steps, 24);
  EXPECT_EQ(uncaptured.end.result.skippedSteps, 1);
  EXPECT_EQ(uncaptured.end.result.skippedSpikes, 1);
  EXPECT_EQ(graphs.end.result.cudaGraphsOff, "");
  EXPECT_EQ(graphs.end.result.cudaGraphSteps, 23);  // all but the warm-up
  EXPECT_EQ(graphs.end.result.skippedSteps, 1);
  EXPECT_EQ(graphs.end.result.skippedSpikes, 1);
  EXPECT_EQ(synchronous.end.result.cudaGraphSteps, 23);
  EXPECT_GT(synchronous.end.result.cudaGraphNodes, 0);
  EXPECT_EQ(graphs.end.result.cudaGraphNodes, synchronous.end.result.cudaGraphNodes + 4);
  ASSERT_EQ(graphs.end.values.size(), uncaptured.end.values.size());
  size_t differ = 0;
  for (size_t i = 0; i < graphs.end.values.size(); ++i) {
    differ += std::memcmp(&graphs.end.values[i], &uncaptured.end.values[i], sizeof(float)) != 0;
  }
  EXPECT_EQ(differ, 0u) << "of " << graphs.end.values.size() << " values";
  EXPECT_EQ(graphs.applied, uncaptured.applied);
  ASSERT_EQ(graphs.gradNorms.size(), 24u);
  ASSERT_EQ(graphs.gradNorms.size(), uncaptured.gradNorms.size());
  for (size_t i = 0; i < graphs.gradNorms.size(); ++i) {
    EXPECT_EQ(std::memcmp(&graphs.gradNorms[i], &uncaptured.gradNorms[i], sizeof(double)), 0)
        << "step " << i << ": " << graphs.gradNorms[i] << " vs " << uncaptured.gradNorms[i];
  }
  EXPECT_TRUE(std::isfinite(uncaptured.testLoss));
  EXPECT_EQ(graphs.testLoss, uncaptured.testLoss);
}

TEST(StepGraphGpu, DropoutFallsBackWithItsReasonAndTheSameResult) {
  COHORT_SKIP_WITHOUT_CUDA_DEVICE();
  const std::string model = "gpt:layers=1,heads=2,dim=8,ctx=4,vocab=6,dropout=0.25";
  const RunEnd uncaptured = train({.model = model, .cudaGraphs = false});
  ::testing::internal::CaptureStdout();  // the job's log lines
  const RunEnd graphs = train({.model = model});
  const std::string log = ::testing::internal::GetCapturedStdout();
  EXPECT_EQ(graphs.result.cudaGraphSteps, 0);
  EXPECT_NE(graphs.result.cudaGraphsOff.find("draws random numbers on the host (dropout)"), std::string::npos)
      << graphs.result.cudaGraphsOff;
  const std::string line = "CUDA graphs off: " + graphs.result.cudaGraphsOff;
  const size_t at = log.find(line);
  EXPECT_NE(at, std::string::npos) << log;
  EXPECT_EQ(log.find(line, at + 1), std::string::npos) << "logged more than once:\n" << log;
  expectSameEnd(graphs, uncaptured);
}

TEST(StepGraphGpu, ALossOfOnesOwnIsNotCapturedAndSaysSo) {
  COHORT_SKIP_WITHOUT_CUDA_DEVICE();
  const RunEnd uncaptured = train({.cudaGraphs = false});
  const RunEnd own = train({.ownLoss = true});
  EXPECT_EQ(own.result.cudaGraphSteps, 0);
  EXPECT_NE(own.result.cudaGraphsOff.find("the loss own is not one of Cohort's"), std::string::npos)
      << own.result.cudaGraphsOff;
  expectSameEnd(own, uncaptured, false);  // its sums are its inner loss's, which the Trainer does not read
}

}  // namespace
}  // namespace cohort::train
