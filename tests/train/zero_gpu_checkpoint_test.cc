// Sharded checkpoints of ZeRO jobs on GPUs (issue 46, item 3; tags = ["gpu"]: on the emulated device
// in CI, whose streams run each operation after a random delay and whose NCCL adds every
// reduction's slots in rank order, so stages 1-3 train to stage 0's bits, as zero_gpu_test shows).
// Two ranks train a GPT with AdamW and clipping on GPUs at stages 0, 1 and 3 and save after 4 of
// 6 steps, synchronously and asynchronously; the asynchronous save is settled only after the last
// step, so its copies to the host race 2 steps that change everything it saves:
//   - every sharded checkpoint, assembled whole, is stage 0's whole checkpoint bit for bit (the
//     parameters, the optimizer state, its step count): the state at the save, not later;
//   - resumed on 2 ranks at another stage and on 1 rank at stage 0 for 3 steps, each ends on the
//     parameters of the same resume from stage 0's checkpoint, bit for bit;
//   - the files are the CPU's: a CPU job resumes a GPU-written checkpoint as it resumes stage 0's,
//     and a GPU job at stage 3 that loads a CPU job's stage-1 checkpoint and saves at once writes
//     that checkpoint again, bit for bit.
// The parent never touches CUDA (a process that forks after initialising CUDA leaves its children
// unable to use it).
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "nn/checkpoint.h"
#include "nn/loss.h"
#include "nn/model_spec.h"
#include "nn/optimizer.h"
#include "nn/sharded_checkpoint.h"
#include "runtime/cuda/gpu_context.h"
#include "runtime/device_query.h"
#include "tests/ipc/multiproc.h"
#include "tests/support/float_file.h"
#include "tests/train/ranks.h"
#include "train/job.h"

namespace cohort::train {
namespace {

using runtime::Shape;
using runtime::Tensor;

constexpr int kTooFewDevices = 77;  // a rank's exit code: fewer CUDA devices than ranks (the parent skips)
constexpr char kModel[] = "gpt:layers=2,heads=2,dim=32,ctx=8,vocab=40";

struct TrainRun {
  std::string name;  // its files: DIR/NAME.ckpt (what it saves), DIR/NAME-rank<R>.bin (its parameters)
  int zero = 0;
  int ranks = 2;
  bool gpu = true;
  int firstStep = 0, steps = 6;
  int saveAfter = 4;  // steps trained before the save (of this run's); -1: no save
  bool async = false;
  std::string resumeFrom = {};  // a checkpoint to load first
};

std::string checkpointOf(const std::string& dir, const std::string& name) { return dir + "/" + name + ".ckpt"; }
std::string paramsOf(const std::string& dir, const std::string& name, int rank) {
  return dir + "/" + name + "-rank" + std::to_string(rank) + ".bin";
}

// The (inputs, targets) of every step of the run, on the job's device, made before any kernel runs
// (a copy to a GPU is a blocking cudaMemcpy that the compute stream does not order).
std::vector<std::pair<Tensor, Tensor>> batches(const TrainRun& run, int rank, Job& job) {
  std::vector<std::pair<Tensor, Tensor>> all;
  Tensor x = Tensor::zeros(Shape{2, 8}), y = Tensor::zeros(Shape{2, 8});
  for (int step = run.firstStep; step < run.firstStep + run.steps; ++step) {
    const std::vector<float> ids = testing::tokenWindow(rank, step, 0, 40);
    for (int b = 0; b < 2; ++b) {
      for (int t = 0; t < 8; ++t) {
        x.at(b * 8 + t) = ids[static_cast<size_t>(b * 9 + t)];
        y.at(b * 8 + t) = ids[static_cast<size_t>(b * 9 + t + 1)];
      }
    }
    if (job.gpu()) {
      all.emplace_back(x.clone(job.gpu()->allocator()), y.clone(job.gpu()->allocator()));
    } else {
      all.emplace_back(x.clone(), y.clone());
    }
  }
  return all;
}

int trainRank(const TrainRun& run, const std::string& dir, const runtime::WorldInfo& world) {
  if (run.gpu && runtime::cudaDevices().size() < static_cast<size_t>(run.ranks)) return kTooFewDevices;
  JobOptions options{.mode = Mode::kAllReduce, .zero = run.zero, .device = run.gpu ? "cuda" : "cpu"};
  if (!run.gpu) {
    options.backend = Backend::kShm;
    options.paramCopies = ParamCopies::kReplicas;
  }
  Job job(options, world);
  auto model = nn::buildModel(kModel);
  auto optimizer =
      job.makeOptimizer({.kind = nn::OptimizerKind::kAdamW, .lr = 3e-3f, .weightDecay = 0.1f}, *model);
  job.place(*model, *optimizer, {.seed = 7});
  if (!run.resumeFrom.empty() && !job.load(run.resumeFrom)) return 4;
  const std::vector<std::pair<Tensor, Tensor>> data = batches(run, world.rank, job);
  nn::SoftmaxCrossEntropy loss;
  for (int i = 0; i <= run.steps; ++i) {
    if (i == run.saveAfter) {
      job.save(checkpointOf(dir, run.name), {{"step", std::to_string(run.firstStep + i)}}, {.async = run.async});
      if (run.async && !job.checkpointInFlight()) return 5;
    }
    if (i == run.steps) break;
    const auto& [x, y] = data[static_cast<size_t>(i)];
    nn::Pass pass = job.pass({});
    if (job.gpu()) {
      loss.forwardGpu(model->forward(x, pass), y, *job.gpu());
    } else {
      loss.forward(model->forward(x, pass), y);
    }
    model->net->backward(loss.backward(), pass);
    const StepResult r = job.step({.clipGradNorm = 0.05f});
    if (!r.applied) return 10 + i;
  }
  // The asynchronous save is committed only now, after the steps that followed it.
  if (run.async && !job.settleCheckpoint()) return 6;
  if (job.gpu()) job.gpu()->stream().synchronize();  // the last update, before wholeParams' blocking copy
  const Tensor v = job.wholeParams();
  return cohort::testing::writeFloats(paramsOf(dir, run.name, world.rank), {v.data(), static_cast<size_t>(v.numel())})
             ? 0
             : 1;
}

// Runs `run`'s ranks as forked processes; false when a GPU run found too few devices.
bool train(const TrainRun& run, const std::string& dir) {
  SCOPED_TRACE(run.name);
  const std::string jobId = ipc::testing::freshJobId();
  std::vector<pid_t> children;
  for (int r = 0; r < run.ranks; ++r) {
    const runtime::WorldInfo world{.rank = r, .worldSize = run.ranks, .localRank = r, .localWorldSize = run.ranks,
                                   .jobId = jobId, .source = run.ranks > 1 ? "test" : "single"};
    children.push_back(ipc::testing::forkChild([=] { return trainRank(run, dir, world); }));
  }
  std::vector<int> codes;
  for (pid_t child : children) codes.push_back(ipc::testing::waitChild(child, std::chrono::seconds(300)));
  if (codes[0] == kTooFewDevices) return false;
  for (int r = 0; r < run.ranks; ++r) EXPECT_EQ(codes[static_cast<size_t>(r)], 0) << run.name << " rank " << r;
  return true;
}

// Every tensor and the optimizer's step count of `mine` (either kind, assembled whole) against
// `reference`'s, bit for bit.
void expectSameCheckpoint(const std::string& mine, const std::string& reference) {
  const auto split = nn::buildModel(kModel)->params.entries();
  const nn::Checkpoint a = nn::readAnyCheckpoint(mine, {.split = split});
  const nn::Checkpoint b = nn::readAnyCheckpoint(reference, {.split = split});
  ASSERT_EQ(a.tensors.size(), b.tensors.size()) << mine;
  ASSERT_GT(b.tensors.size(), 10u) << reference;
  for (const nn::NamedTensor& t : b.tensors) {
    const Tensor* got = a.find(t.name);
    ASSERT_NE(got, nullptr) << mine << " lacks " << t.name;
    ASSERT_EQ(got->numel(), t.tensor.numel()) << t.name;
    EXPECT_EQ(std::memcmp(got->data(), t.tensor.data(), t.tensor.bytes()), 0) << mine << ": " << t.name;
  }
  EXPECT_EQ(a.metadata.at("optimizer_steps"), b.metadata.at("optimizer_steps")) << mine;
  EXPECT_EQ(a.metadata.at("step"), b.metadata.at("step")) << mine;
}

void expectSameParams(const std::string& dir, const std::string& mine, const std::string& reference) {
  const std::vector<float> want = cohort::testing::readFloats(paramsOf(dir, reference, 0));
  ASSERT_GT(want.size(), 10000u) << reference;
  const std::vector<float> got = cohort::testing::readFloats(paramsOf(dir, mine, 0));
  ASSERT_EQ(got.size(), want.size()) << mine;
  const cohort::testing::FloatDifference d = cohort::testing::compareFloats(got, want);
  EXPECT_EQ(d.bitsDiffer, 0u) << mine << " against " << reference << ": worst relative " << d.worstRelative;
  std::printf("%s: %zu of %zu parameters differ from %s's bits\n", mine.c_str(), d.bitsDiffer, want.size(),
              reference.c_str());
}

TEST(ZeroGpuCheckpoint, SavesAtStagesOneAndThreeResumeAnywhereAsStageZerosDoes) {
  ipc::testing::ScopedShmDir shm;
  const std::string dir = shm.path();
  if (!train({.name = "s0", .zero = 0}, dir)) GTEST_SKIP() << "needs 2 CUDA devices (the emulated device offers several)";
  for (const TrainRun& run : {TrainRun{.name = "s1", .zero = 1}, TrainRun{.name = "s1-async", .zero = 1, .async = true},
                         TrainRun{.name = "s3", .zero = 3}, TrainRun{.name = "s3-async", .zero = 3, .async = true}}) {
    train(run, dir);
    expectSameCheckpoint(checkpointOf(dir, run.name), checkpointOf(dir, "s0"));
    expectSameParams(dir, run.name, "s0");  // and the steps after the save trained on alike
  }
  // Resumes: 3 steps from step 4, each against the same resume of stage 0's checkpoint.
  struct Target {
    std::string name;
    int zero, ranks;
    bool gpu;
    std::vector<std::string> from;
  };
  const std::vector<Target> targets = {{"at3-w2", 3, 2, true, {"s1"}},
                                       {"at1-w2", 1, 2, true, {"s3-async"}},
                                       {"at0-w1", 0, 1, true, {"s1", "s3-async"}},
                                       {"cpu-at0-w1", 0, 1, false, {"s3-async"}}};
  for (const Target& t : targets) {
    for (const std::string& from : [&] {
           std::vector<std::string> all = t.from;
           all.push_back("s0");
           return all;
         }()) {
      train({.name = t.name + "-from-" + from, .zero = t.zero, .ranks = t.ranks, .gpu = t.gpu, .firstStep = 4,
             .steps = 3, .saveAfter = -1, .resumeFrom = checkpointOf(dir, from)},
            dir);
    }
    for (const std::string& from : t.from) expectSameParams(dir, t.name + "-from-" + from, t.name + "-from-s0");
  }
}

// A CPU job's sharded checkpoint (2 ranks over shm, stage 1) loads into a GPU job at stage 3, which
// saves it again at once: the same checkpoint, bit for bit.
TEST(ZeroGpuCheckpoint, ACpuCheckpointLoadsOnGpusAndSavesBackTheSame) {
  ipc::testing::ScopedShmDir shm;
  const std::string dir = shm.path();
  train({.name = "cpu-s1", .zero = 1, .gpu = false}, dir);
  if (!train({.name = "gpu-s3", .zero = 3, .firstStep = 4, .steps = 0, .saveAfter = 0,
              .resumeFrom = checkpointOf(dir, "cpu-s1")},
             dir)) {
    GTEST_SKIP() << "needs 2 CUDA devices (the emulated device offers several)";
  }
  expectSameCheckpoint(checkpointOf(dir, "gpu-s3"), checkpointOf(dir, "cpu-s1"));
  ASSERT_TRUE(nn::committedShardGeneration(checkpointOf(dir, "gpu-s3")).has_value());
}

}  // namespace
}  // namespace cohort::train
