// train::Trainer on a GPU (tags = ["gpu"]; skips with the reason when no CUDA device is usable):
// token ids a GPU Embedding cannot refuse in forward (it gives NaN rows) are named as the CPU names
// them, InvalidArgument with the position and value, not reported as a diverged step, both in
// training and in the evaluation. The sync-free step (issue 31): a NaN gradient at step k stops the
// run naming step k with nothing of steps k and k + 1 applied, and runs that skip it, clip, and
// follow a learning-rate schedule end bit for bit where the synchronous step ends, and so do runs
// whose gradient spikes are skipped by the device's guard (--skip-spikes). Two NCCL ranks in
// bf16 end bit for bit alike.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "nn/loss.h"
#include "nn/model_spec.h"
#include "nn/optimizer.h"
#include "runtime/data/dataset.h"
#include "runtime/error.h"
#include "runtime/cuda/elementwise.h"
#include "runtime/cuda/gpu_context.h"
#include "runtime/device_query.h"
#include "runtime/dtype.h"
#include "tests/runtime/cuda/gpu_test_util.h"
#include "tests/train/ranks.h"
#include "tests/support/float_file.h"
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

// Cross-entropy whose gradient is NaN in the training forwards numbered in `nanSteps` (from 1), and
// 1000 times larger in those in `spikeSteps`: the step's gradient is non-finite, or a spike; its
// loss stays on the device. Evaluation never runs in these tests.
class NanGradientAt final : public nn::Loss {
 public:
  explicit NanGradientAt(std::vector<int64_t> nanSteps, std::vector<int64_t> spikeSteps = {})
      : nanSteps_(std::move(nanSteps)), spikeSteps_(std::move(spikeSteps)) {}
  std::string name() const override { return "nan-gradient-at"; }
  float forward(const Tensor& out, const Tensor& targets) override { return inner_.forward(out, targets); }
  void forwardGpu(const Tensor& out, const Tensor& targets, runtime::cuda::GpuContext& gpu) override {
    inner_.forwardGpu(out, targets, gpu);
    ++calls_;
    const Tensor& g = inner_.backward();
    const std::span<float> grads{g.data(), static_cast<size_t>(g.numel())};
    if (std::find(nanSteps_.begin(), nanSteps_.end(), calls_) != nanSteps_.end()) {
      runtime::cuda::fill(grads, std::numeric_limits<float>::quiet_NaN(), gpu.stream());
    } else if (std::find(spikeSteps_.begin(), spikeSteps_.end(), calls_) != spikeSteps_.end()) {
      runtime::cuda::scale(grads, 1000.0f, gpu.stream());
    }
  }
  const Tensor& backward() override { return inner_.backward(); }
  int64_t correct() const override { return inner_.correct(); }

 private:
  nn::SoftmaxCrossEntropy inner_;
  std::vector<int64_t> nanSteps_, spikeSteps_;
  int64_t calls_ = 0;
};

struct RunOptions {
  nn::OptimizerOptions optimizer;
  TrainerOptions trainer;
  std::vector<int64_t> nanSteps;
  std::vector<int64_t> spikeSteps;
};

// The parameters and optimizer state at the end of a run on the GPU (on the host), the error it
// stopped with ("" for none), and the optimizer's step count.
struct RunEnd {
  std::vector<float> values;
  std::string error;
  int64_t steps = 0;
  int64_t skipped = 0;
  int64_t spikes = 0;
};

std::vector<float> toHost(const Tensor& t) {
  Tensor host = Tensor::zeros(t.shape());
  host.copyFrom(t);
  return std::vector<float>(host.data(), host.data() + host.numel());
}

RunEnd train(const RunOptions& o) {
  Job job({.device = "cuda"}, runtime::WorldInfo{});
  auto data = testing::teacherData(192);
  auto model = nn::buildModel("mlp:20,16,3");
  auto optimizer = nn::makeOptimizer(o.optimizer, model->params.numel(), job.gpu());
  job.place(*model, *optimizer, {.seed = 1});
  NanGradientAt loss(o.nanSteps, o.spikeSteps);
  Trainer trainer(job, loss, *data, nullptr, o.trainer);
  RunEnd end;
  try {
    const TrainResult result = trainer.run();
    end.skipped = result.skippedSteps;
    end.spikes = result.skippedSpikes;
  } catch (const Diverged& e) {
    end.error = e.what();
  }
  end.values = toHost(model->params.values());
  for (const auto& s : optimizer->state()) {
    const std::vector<float> state = toHost(s.tensor);
    end.values.insert(end.values.end(), state.begin(), state.end());
  }
  end.steps = optimizer->steps();
  return end;
}

// Bit for bit, NaN for NaN.
void expectSameBits(const std::vector<float>& a, const std::vector<float>& b) {
  ASSERT_EQ(a.size(), b.size());
  size_t differ = 0;
  for (size_t i = 0; i < a.size(); ++i) differ += std::memcmp(&a[i], &b[i], sizeof(float)) != 0;
  EXPECT_EQ(differ, 0u) << "of " << a.size() << " values";
}

TrainerOptions trainerOptions(bool synchronous) {
  return {.epochs = 2, .batchSize = 16, .seed = 2, .progressEverySeconds = 0, .synchronousSteps = synchronous};
}

// 12 steps an epoch. Step 5's gradient is NaN: the run stops there naming step 5, and the
// parameters and momentum are those after step 4, as the synchronous step leaves them (which reads
// the norm before it applies anything) and as a run stopped after 4 steps leaves them: step 6,
// queued before the host read step 5's record, did nothing either.
TEST(TrainerGpu, ANanGradientStopsTheSyncFreeRunAtItsStepWithNothingApplied) {
  COHORT_SKIP_WITHOUT_CUDA_DEVICE();
  RunOptions o{.optimizer = {.lr = 0.05f, .momentum = 0.9f}, .trainer = trainerOptions(false), .nanSteps = {5}};
  const RunEnd deferred = train(o);
  EXPECT_NE(deferred.error.find("step 5 (epoch 1, batch 5): the gradient is non-finite"), std::string::npos)
      << deferred.error;
  EXPECT_NE(deferred.error.find("training diverged"), std::string::npos) << deferred.error;
  EXPECT_EQ(deferred.steps, 4);
  o.trainer.synchronousSteps = true;
  const RunEnd synchronous = train(o);
  EXPECT_EQ(synchronous.error, deferred.error);
  expectSameBits(deferred.values, synchronous.values);
  o = {.optimizer = o.optimizer, .trainer = trainerOptions(false)};
  o.trainer.maxSteps = 4;
  const RunEnd fourSteps = train(o);
  EXPECT_EQ(fourSteps.error, "");
  expectSameBits(deferred.values, fourSteps.values);
}

// With a skip allowed, step 5 is skipped and the schedule does not advance for it: the sync-free
// run ends bit for bit where the synchronous one does (parameters and optimizer state), for SGD
// with momentum and clipping, and for AdamW under a warmup and cosine schedule (whose learning
// rate for the step after 5 depends on step 5's outcome, which the host did not know yet), with
// the gradient clipped on the device exactly as the host formula clips it.
TEST(TrainerGpu, SkippingANanGradientEndsBitForBitLikeTheSynchronousStep) {
  COHORT_SKIP_WITHOUT_CUDA_DEVICE();
  const std::vector<nn::OptimizerOptions> optimizers = {
      {.lr = 0.05f, .momentum = 0.9f, .nesterov = true, .weightDecay = 1e-3f},
      {.kind = nn::OptimizerKind::kAdamW, .lr = 0.01f, .weightDecay = 0.01f}};
  for (const nn::OptimizerOptions& optimizer : optimizers) {
    for (const float clip : {0.0f, 0.5f}) {
      SCOPED_TRACE(::testing::Message() << "optimizer " << static_cast<int>(optimizer.kind) << ", clip " << clip);
      RunOptions o{.optimizer = optimizer, .trainer = trainerOptions(false), .nanSteps = {5}};
      o.trainer.skipNonFinite = 1;
      o.trainer.clipGradNorm = clip;
      o.trainer.lrSchedule = nn::LrScheduleOptions{.kind = nn::LrScheduleKind::kCosine, .baseLr = optimizer.lr,
                                                   .warmupSteps = 3, .minLr = 1e-4};
      const RunEnd deferred = train(o);
      o.trainer.synchronousSteps = true;
      const RunEnd synchronous = train(o);
      EXPECT_EQ(deferred.error, "");
      EXPECT_EQ(synchronous.error, "");
      EXPECT_EQ(deferred.skipped, 1);
      EXPECT_EQ(deferred.steps, 23);  // 24 steps, one skipped
      EXPECT_EQ(deferred.steps, synchronous.steps);
      expectSameBits(deferred.values, synchronous.values);
    }
  }
}

// A second NaN beyond the one skip allowed stops the run there (step 9), after the skip of step 5,
// with what the synchronous step leaves.
TEST(TrainerGpu, TheNonFiniteStepAfterTheLastSkipStopsTheSyncFreeRun) {
  COHORT_SKIP_WITHOUT_CUDA_DEVICE();
  RunOptions o{.optimizer = {.lr = 0.05f, .momentum = 0.9f}, .trainer = trainerOptions(false), .nanSteps = {5, 9}};
  o.trainer.skipNonFinite = 1;
  const RunEnd deferred = train(o);
  EXPECT_NE(deferred.error.find("step 9 (epoch 1, batch 9): the gradient is non-finite"), std::string::npos)
      << deferred.error;
  EXPECT_NE(deferred.error.find("the 1 skips allowed are used up"), std::string::npos) << deferred.error;
  EXPECT_EQ(deferred.steps, 7);
  o.trainer.synchronousSteps = true;
  const RunEnd synchronous = train(o);
  EXPECT_EQ(synchronous.error, deferred.error);
  expectSameBits(deferred.values, synchronous.values);
}

// The spike rule on the device (--skip-spikes): steps 20 and 21 have 1000 times the gradient and
// are skipped, judged against the history the host had when it queued them, as the synchronous
// step judges them; the runs end bit for bit alike. With at most one spike in a row, the second
// stops the run (Diverged) where the synchronous run stops.
TEST(TrainerGpu, SpikesAreSkippedOnTheDeviceAsByTheSynchronousStep) {
  COHORT_SKIP_WITHOUT_CUDA_DEVICE();
  RunOptions o{.optimizer = {.lr = 0.05f, .momentum = 0.9f}, .trainer = trainerOptions(false), .spikeSteps = {20, 21}};
  o.trainer.skipSpikes = 5;
  const RunEnd deferred = train(o);
  o.trainer.synchronousSteps = true;
  const RunEnd synchronous = train(o);
  EXPECT_EQ(deferred.error, "");
  EXPECT_EQ(deferred.spikes, 2);
  EXPECT_EQ(deferred.steps, 22);  // 24 steps, two skipped
  EXPECT_EQ(synchronous.spikes, 2);
  expectSameBits(deferred.values, synchronous.values);
  o.trainer.maxSpikesInARow = 1;
  const RunEnd stopped = train(o);
  EXPECT_NE(stopped.error.find("step 21 (epoch 2, batch 9): the gradient's norm spiked"), std::string::npos)
      << stopped.error;
  EXPECT_NE(stopped.error.find("2 spikes in a row"), std::string::npos) << stopped.error;
  o.trainer.synchronousSteps = false;
  EXPECT_EQ(train(o).error, stopped.error);
}

// Exit code of a rank that found fewer than two CUDA devices (the parent then skips).
constexpr int kTooFewDevices = 77;

// One rank of a two-GPU all-reduce job in bf16: 24 AdamW steps, then its parameters and optimizer
// state into `dir`/rank<r>.bin.
int trainBf16Rank(const runtime::WorldInfo& world, const std::string& dir) {
  if (runtime::cudaDevices().size() < 2) return kTooFewDevices;
  Job job({.mode = Mode::kAllReduce, .device = "cuda", .precision = runtime::DType::kBF16}, world);
  auto data = testing::teacherData(384);
  auto model = nn::buildModel("mlp:20,32,3");
  auto optimizer = nn::makeOptimizer({.kind = nn::OptimizerKind::kAdamW, .lr = 0.01f}, model->params.numel(), job.gpu());
  job.place(*model, *optimizer, {.seed = 1});
  nn::SoftmaxCrossEntropy loss;
  Trainer trainer(job, loss, *data, nullptr, {.epochs = 2, .batchSize = 16, .seed = 2, .progressEverySeconds = 0});
  trainer.run();
  std::vector<float> values = toHost(model->params.values());
  for (const auto& s : optimizer->state()) {
    const std::vector<float> state = toHost(s.tensor);
    values.insert(values.end(), state.begin(), state.end());
  }
  std::ofstream out(dir + "/rank" + std::to_string(world.rank) + ".bin", std::ios::binary);
  out.write(reinterpret_cast<const char*>(values.data()), static_cast<std::streamsize>(values.size() * sizeof(float)));
  return out.good() ? 0 : 1;
}

using cohort::testing::readFloats;

// Two replicas all-reducing over NCCL in bf16 (issue 31) end bit for bit alike: both average the
// same fp32 gradients and take the same device decisions, and bf16's rounding is deterministic. The
// parent never touches CUDA (a process that forks after initialising CUDA leaves its children
// unable to use it): the ranks look for the devices themselves.
TEST(TrainerGpu, TwoNcclRanksStayBitIdenticalInBf16) {
  ipc::testing::ScopedShmDir shm;
  const std::string dir = shm.path();
  const std::string jobId = ipc::testing::freshJobId();
  std::vector<pid_t> children;
  for (int r = 0; r < 2; ++r) {
    const runtime::WorldInfo world{.rank = r, .worldSize = 2, .localRank = r, .localWorldSize = 2, .jobId = jobId,
                                   .source = "test"};
    children.push_back(ipc::testing::forkChild([=] { return trainBf16Rank(world, dir); }));
  }
  std::vector<int> codes;
  for (pid_t child : children) codes.push_back(ipc::testing::waitChild(child, std::chrono::seconds(240)));
  if (codes[0] == kTooFewDevices) GTEST_SKIP() << "needs 2 CUDA devices";
  ASSERT_EQ(codes[0], 0);
  ASSERT_EQ(codes[1], 0);
  const std::vector<float> a = readFloats(dir + "/rank0.bin"), b = readFloats(dir + "/rank1.bin");
  ASSERT_GT(a.size(), 0u);
  expectSameBits(a, b);
}

}  // namespace
}  // namespace cohort::train
