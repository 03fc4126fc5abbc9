// ZeRO on GPUs over NCCL (tags = ["gpu"]; on the emulated device in CI, whose streams run their
// operations after random delays, and whose NCCL folds every reduction's slots in rank order, the
// reduce-scatter's pieces as the all-reduce's: cudasim/nccl.cc): two ranks train a GPT with AdamW,
// clipping by the global norm (the limit is below the norms, so it clips) and 2 micro-batches per
// step, each rank on its own tokens, at stages 0, 1, 2 and 3. Every stage's parameters on every
// rank end on stage 0's rank 0's, bit for bit (the averages are the all-reduce's bits; the norm's
// double sum over the shard rounds to the same float clip coefficient here), so a window reused
// before its collective was done, or a piece read before its reduce-scatter, would show. Stages
// 1-3 ask for deferred results on odd steps: the sharded placement steps synchronously and the
// result is ready at settleStep(). The caching allocator's bytes after place() (parameters,
// gradients, shards, windows; the optimizer state taken out) fall at stage 2 to about (1 + 1/W)/2 of
// stage 0's and at stage 3 to about 1/W. The parent never touches CUDA (a process that forks after
// initialising CUDA leaves its children unable to use it).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "nn/loss.h"
#include "nn/model_spec.h"
#include "nn/optimizer.h"
#include "runtime/cuda/gpu_context.h"
#include "runtime/device_query.h"
#include "tests/ipc/multiproc.h"
#include "tests/support/float_file.h"
#include "tests/train/zero_gpu_steps.h"
#include "train/job.h"

namespace cohort::train {
namespace {

using runtime::Tensor;

constexpr int kTooFewDevices = 77;  // a rank's exit code: fewer than two CUDA devices (the parent skips)
constexpr char kModel[] = "gpt:layers=3,heads=2,dim=32,ctx=8,vocab=40";
constexpr int kSteps = 8, kMicroBatches = 2;

std::string pathOf(const std::string& dir, int zero, int rank) {
  return dir + "/zero" + std::to_string(zero) + "-rank" + std::to_string(rank) + ".bin";
}
std::string bytesPathOf(const std::string& dir, int zero) {
  return dir + "/zero" + std::to_string(zero) + "-bytes.bin";
}

// One rank at one stage: its parameters into pathOf, and (rank 0) the device bytes the placement
// holds besides the optimizer state, after place(), into bytesPathOf.
int trainRank(const runtime::WorldInfo& world, const std::string& dir, int zero) {
  if (runtime::cudaDevices().size() < 2) return kTooFewDevices;
  Job job({.mode = Mode::kAllReduce, .zero = zero, .device = "cuda"}, world);
  auto model = nn::buildModel(kModel);
  auto optimizer = nn::makeOptimizer({.kind = nn::OptimizerKind::kAdamW, .lr = 3e-3f, .weightDecay = 0.1f},
                                     model->params.numel(), job.gpu());
  job.place(*model, *optimizer, {.seed = 7});
  const double held =
      static_cast<double>(job.deviceMemoryStats()->allocatedBytes) - static_cast<double>(job.stateBytes().optimizer);
  const std::vector<std::pair<Tensor, Tensor>> data =
      testing::gpuTokenBatches(world.rank, kSteps, kMicroBatches, 40, *job.gpu());
  nn::SoftmaxCrossEntropy loss;
  for (int step = 0; step < kSteps; ++step) {
    for (int k = 0; k < kMicroBatches; ++k) {
      const auto& [x, y] = data[static_cast<size_t>(step * kMicroBatches + k)];
      nn::Pass pass = job.pass({.microBatch = k, .microBatches = kMicroBatches});
      loss.forwardGpu(model->forward(x, pass), y, *job.gpu());
      model->net->backward(loss.backward(), pass);
    }
    if (const int failed = testing::clippedStep(job, zero, step)) return failed;
  }
  job.gpu()->stream().synchronize();  // the last update, before Job::wholeParams' blocking copy (stage 0)
  const Tensor v = job.wholeParams();
  if (!cohort::testing::writeFloats(pathOf(dir, zero, world.rank), {v.data(), static_cast<size_t>(v.numel())}))
    return 1;
  const std::vector<float> bytes{static_cast<float>(held), static_cast<float>(model->params.bytes())};
  return world.rank > 0 || cohort::testing::writeFloats(bytesPathOf(dir, zero), bytes) ? 0 : 1;
}

using cohort::testing::readFloats;

using Difference = cohort::testing::FloatDifference;
constexpr auto compare = cohort::testing::compareFloats;

TEST(ZeroGpu, StagesOneToThreeTrainToStageZerosParametersInLessMemory) {
  ipc::testing::ScopedShmDir shm;
  const std::string dir = shm.path();
  for (int zero : {0, 1, 2, 3}) {
    const std::string jobId = ipc::testing::freshJobId();
    std::vector<pid_t> children;
    for (int r = 0; r < 2; ++r) {
      const runtime::WorldInfo world{
          .rank = r, .worldSize = 2, .localRank = r, .localWorldSize = 2, .jobId = jobId, .source = "test"};
      children.push_back(ipc::testing::forkChild([=] { return trainRank(world, dir, zero); }));
    }
    std::vector<int> codes;
    for (pid_t child : children) codes.push_back(ipc::testing::waitChild(child, std::chrono::seconds(240)));
    if (codes[0] == kTooFewDevices) GTEST_SKIP() << "needs 2 CUDA devices (the emulated device offers several)";
    ASSERT_EQ(codes[0], 0) << "stage " << zero;
    ASSERT_EQ(codes[1], 0) << "stage " << zero;
  }
  const std::vector<float> reference = readFloats(pathOf(dir, 0, 0));
  ASSERT_GT(reference.size(), 10000u);
  EXPECT_EQ(compare(readFloats(pathOf(dir, 0, 1)), reference).bitsDiffer, 0u) << "stage 0's replicas";
  for (int zero : {1, 2, 3}) {
    for (int r = 0; r < 2; ++r) {
      const std::vector<float> mine = readFloats(pathOf(dir, zero, r));
      ASSERT_EQ(mine.size(), reference.size()) << "stage " << zero << " rank " << r;
      const Difference d = compare(mine, reference);
      EXPECT_LE(d.worstRelative, 1e-6) << "stage " << zero << " rank " << r;
      EXPECT_EQ(d.bitsDiffer, 0u) << "stage " << zero << " rank " << r;
      std::printf("stage %d rank %d: %zu of %zu parameters differ from stage 0's bits, worst relative %.3g\n", zero, r,
                  d.bitsDiffer, reference.size(), d.worstRelative);
    }
  }
  // Device bytes besides the optimizer state: 2N at stage 0 (N the parameters' bytes), N + N/W at
  // stage 2, 2N/W at stage 3, each with the padding and the windows of the units kept whole.
  std::vector<double> held;
  for (int zero : {0, 1, 2, 3}) {
    const std::vector<float> bytes = readFloats(bytesPathOf(dir, zero));
    ASSERT_EQ(bytes.size(), 2u);
    held.push_back(bytes[0]);
    std::printf("stage %d: %.0f device bytes besides the optimizer state (parameters %.0f bytes)\n", zero, bytes[0],
                bytes[1]);
  }
  EXPECT_GE(held[0], 2 * readFloats(bytesPathOf(dir, 0))[1]);
  EXPECT_LT(held[2], 0.78 * held[0]) << "stage 2 keeps the gradient's shard: about 3/4 of stage 0's";
  EXPECT_LT(held[3], 0.53 * held[0]) << "stage 3 keeps both shards: about 1/2 of stage 0's";
}

}  // namespace
}  // namespace cohort::train
