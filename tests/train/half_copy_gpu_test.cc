// The Trainer and the parameters' bf16 copy (nn/param_buffer.h, "The bf16 copy"; tags = ["gpu"]: the
// emulated device in CI). The Trainer trusts the copy for its run (Job::trustHalfCopy): its forwards
// convert nothing and the optimizer's step kernel writes the copy with the values. Trusted, a
// bf16 GPT and a bf16 MLP end bit for bit where the same runs end with the copy untrusted (each
// forward refreshing it, as a loop of one's own does), with accumulation, evaluations and CUDA
// graphs; the conversions are counted (ParamBuffer::halfConversions): untrusted one per forward,
// trusted one when the run starts, none after a step or in a forward. After the run the copy is no longer trusted. A loop of one's own that
// trusts the copy through the Job sees each step's weights.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "nn/loss.h"
#include "nn/model_spec.h"
#include "nn/optimizer.h"
#include "runtime/data/dataset.h"
#include "runtime/dtype.h"
#include "tests/runtime/cuda/gpu_test_util.h"
#include "train/job.h"
#include "train/trainer.h"

#ifdef COHORT_HAVE_CUDA
#include "runtime/cuda/gpu_context.h"
#endif

namespace cohort::train {
namespace {

using runtime::Shape;
using runtime::Tensor;

// `windows` windows of 4 token ids below 6 (a GPT's), or rows of 4 values with a class below 6 (an MLP's).
runtime::data::Dataset data(int64_t windows, int64_t offset, bool gpt) {
  runtime::data::DatasetContents c{.name = "ids",
                                   .inputs = Tensor::zeros(Shape{windows, 4}),
                                   .targets = gpt ? Tensor::zeros(Shape{windows, 4}) : Tensor::zeros(Shape{windows}),
                                   .numClasses = 6};
  for (int64_t i = 0; i < windows * 4; ++i) {
    c.inputs.at(i) = gpt ? static_cast<float>((i * 5 + offset) % 6) : static_cast<float>((i * 7 + offset) % 9) * 0.25f - 1;
  }
  for (int64_t i = 0; i < c.targets.numel(); ++i) c.targets.at(i) = static_cast<float>((i * 5 + offset + 1) % 6);
  return runtime::data::Dataset(std::move(c));
}

std::vector<float> toHost(const Tensor& t) {
  Tensor host = Tensor::zeros(t.shape());
  host.copyFrom(t);
  return std::vector<float>(host.data(), host.data() + host.numel());
}

struct RunOptions {
  std::string model = "gpt:layers=2,heads=2,dim=8,ctx=4,vocab=6";
  bool trusted = true;
  int64_t accumulate = 1;
  bool evaluate = true;
  bool cudaGraphs = false;
};

struct RunEnd {
  std::vector<float> values;   // parameters, then the optimizer's state
  std::vector<double> losses;  // each epoch's train loss and test loss
  int64_t steps = 0, graphSteps = 0;
  uint64_t conversions = 0;
  bool trustedAfter = true;
};

// 2 epochs of 16 samples in batches of 4, an evaluation every 3 steps (unless not).
RunEnd train(const RunOptions& o) {
  JobOptions jobOptions{.device = "cuda", .precision = runtime::DType::kBF16};
  jobOptions.testHooks.untrustedHalfCopy = !o.trusted;
  Job job(jobOptions, runtime::WorldInfo{});
  auto model = nn::buildModel(o.model);
  auto optimizer = nn::makeOptimizer({.kind = nn::OptimizerKind::kAdamW, .lr = 0.01f, .weightDecay = 0.1f},
                                     model->params.numel(), job.gpu());
  job.place(*model, *optimizer, {.seed = 1});
  nn::SoftmaxCrossEntropy crossEntropy;
  const bool gpt = o.model.rfind("gpt:", 0) == 0;
  const runtime::data::Dataset trainSet = data(16, 0, gpt), test = data(6, 1, gpt);
  RunEnd end;
  TrainerCallbacks callbacks{.onEpochEnd = [&](EpochReport& r) {
    end.losses.push_back(r.trainLoss);
    end.losses.push_back(r.testLoss);
    return Next::kContinue;
  }};
  Trainer trainer(job, crossEntropy, trainSet, o.evaluate ? &test : nullptr,
                  {.epochs = 2, .batchSize = 4, .accumulateSteps = o.accumulate, .seed = 2,
                   .evalEverySteps = o.evaluate ? 3 : 0, .clipGradNorm = 1.0f, .progressEverySeconds = 0,
                   .cudaGraphs = o.cudaGraphs},
                  callbacks);
  const TrainResult result = trainer.run();
  end.steps = result.steps;
  end.graphSteps = result.cudaGraphSteps;
  end.conversions = model->params.halfConversions();
  end.trustedAfter = model->params.halfCopyTrusted();
  end.values = toHost(model->params.values());
  for (const auto& s : optimizer->state()) {
    const std::vector<float> state = toHost(s.tensor);
    end.values.insert(end.values.end(), state.begin(), state.end());
  }
  return end;
}

void expectSameEnd(const RunEnd& a, const RunEnd& b) {
  ASSERT_EQ(a.values.size(), b.values.size());
  size_t differ = 0;
  for (size_t i = 0; i < a.values.size(); ++i) differ += std::memcmp(&a.values[i], &b.values[i], sizeof(float)) != 0;
  EXPECT_EQ(differ, 0u) << "of " << a.values.size() << " values";
  EXPECT_EQ(a.steps, b.steps);
  ASSERT_EQ(a.losses.size(), 4u);
  ASSERT_EQ(a.losses.size(), b.losses.size());
  for (size_t i = 0; i < a.losses.size(); ++i) EXPECT_EQ(a.losses[i], b.losses[i]) << i;
}

TEST(HalfCopyGpu, TrustedRunsEndBitForBitWhereUntrustedRunsEnd) {
  COHORT_SKIP_WITHOUT_CUDA_DEVICE();
  for (const std::string model : {"gpt:layers=2,heads=2,dim=8,ctx=4,vocab=6", "mlp:4,8,8,6"}) {
    for (int64_t accumulate : {1, 2}) {
      SCOPED_TRACE(model + " accumulating " + std::to_string(accumulate));
      const RunEnd trusted = train({.model = model, .accumulate = accumulate});
      const RunEnd untrusted = train({.model = model, .trusted = false, .accumulate = accumulate});
      expectSameEnd(trusted, untrusted);
      EXPECT_EQ(trusted.steps, 8 / accumulate);
      // The run's start and each step's: none in the training's or the evaluations' forwards.
      EXPECT_EQ(trusted.conversions, 1u) << "the run's start only: the optimizer writes the copy";
      EXPECT_FALSE(trusted.trustedAfter) << "still trusted after the run";
    }
  }
}

TEST(HalfCopyGpu, CudaGraphsReplayTheUntrustedRefreshAndSkipTheTrustedOne) {
  COHORT_SKIP_WITHOUT_CUDA_DEVICE();
  const RunEnd eager = train({.trusted = false});
  const RunEnd trusted = train({.cudaGraphs = true});
  const RunEnd untrusted = train({.trusted = false, .cudaGraphs = true});
  EXPECT_GT(trusted.graphSteps, 0);
  EXPECT_EQ(untrusted.graphSteps, trusted.graphSteps);
  EXPECT_EQ(trusted.conversions, 1u) << "a conversion in a forward or after a step";
  expectSameEnd(trusted, eager);
  expectSameEnd(untrusted, eager);
}

// No evaluation, so the forwards are the training's: 8 batches (4 steps of 2 micro-batches, or 8).
TEST(HalfCopyGpu, ConversionsAreOnePerUntrustedForwardAndNoneInATrustedOne) {
  COHORT_SKIP_WITHOUT_CUDA_DEVICE();
  for (int64_t accumulate : {1, 2}) {
    SCOPED_TRACE("accumulating " + std::to_string(accumulate));
    const RunEnd untrusted = train({.trusted = false, .accumulate = accumulate, .evaluate = false});
    EXPECT_EQ(untrusted.conversions, 8u);
    const RunEnd trusted = train({.accumulate = accumulate, .evaluate = false});
    ASSERT_EQ(trusted.steps, 8 / accumulate);
    EXPECT_EQ(trusted.conversions, 1u) << "the run's start only; the steps' kernels write the copy";
  }
}

// A loop of one's own trusting the copy through the Job: after each step the forward computes with
// the step's weights, as a forward that refreshes the copy itself does.
TEST(HalfCopyGpu, ALoopOfOnesOwnThatTrustsTheCopySeesEachStepsWeights) {
  COHORT_SKIP_WITHOUT_CUDA_DEVICE();
  Job job({.device = "cuda", .precision = runtime::DType::kBF16}, runtime::WorldInfo{});
  auto model = nn::buildModel("mlp:4,8,6");
  auto optimizer = nn::makeOptimizer({.kind = nn::OptimizerKind::kAdamW, .lr = 0.05f}, model->params.numel(), job.gpu());
  job.place(*model, *optimizer, {.seed = 1});
  ASSERT_TRUE(job.trustHalfCopy(true));
  runtime::cuda::GpuContext& gpu = *job.gpu();
  const runtime::data::Dataset rows = data(4, 0, false);
  const Tensor x = rows.rows(0, 4).inputs.clone(gpu.allocator());
  const Tensor y = rows.rows(0, 4).targets.clone(gpu.allocator());
  nn::SoftmaxCrossEntropy loss;
  for (int step = 0; step < 3; ++step) {
    const uint64_t before = model->params.halfConversions();
    const nn::Pass pass = job.pass();
    loss.forwardGpu(model->forward(x, pass, loss.readsBf16()), y, gpu);
    model->backward(loss.backward(), pass);
    job.step();
    const Tensor& out = model->forward(x, job.evalPass());
    gpu.stream().synchronize();
    const std::vector<float> trusted = toHost(out);
    EXPECT_EQ(model->params.halfConversions(), before)
        << "none: the step's kernel wrote the copy, and neither forward converts";
    job.trustHalfCopy(false);
    const Tensor& again = model->forward(x, job.evalPass());
    gpu.stream().synchronize();
    const std::vector<float> refreshed = toHost(again);
    ASSERT_TRUE(job.trustHalfCopy(true));
    ASSERT_EQ(trusted.size(), refreshed.size());
    EXPECT_EQ(std::memcmp(trusted.data(), refreshed.data(), trusted.size() * sizeof(float)), 0) << "step " << step;
  }
}

}  // namespace
}  // namespace cohort::train
