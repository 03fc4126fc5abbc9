// Sharded checkpoints in training (issue 46, item 3): a ZeRO job's Job::save writes one shard file
// per rank and a manifest, nothing whole; the sharded checkpoint holds stage 0's whole checkpoint's
// state bit for bit, and resumes on 1 rank at stage 0, 3 ranks at stage 2 and 4 ranks at stage 1
// exactly as stage 0's whole checkpoint resumes there (parameters and optimizer state compared bit
// for bit after 6 more steps); asynchronous saves commit the same state as synchronous ones; a
// whole-model checkpoint still loads into a sharded job (the same resumes); the model's buffers
// (BatchNorm running statistics) survive in the manifest.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "nn/checkpoint.h"
#include "nn/model_spec.h"
#include "nn/sharded_checkpoint.h"
#include "tests/ipc/multiproc.h"
#include "tests/support/float_file.h"
#include "tests/train/ranks.h"
#include "tests/train/sharded_run.h"

namespace cohort::train {
namespace {

using testing::ShardedRun;

void runJob(int ranks, const ShardedRun& run) {
  testing::runRanks(ranks, [&](const runtime::WorldInfo& world) { return testing::runShardedRank(run, world); });
}

using testing::expectSameState;

nn::Checkpoint readWhole(const std::string& path, const std::string& model = testing::kShardedRunModel) {
  return testing::readWholeCheckpoint(path, model);
}

// The names in `dir` that begin with `prefix`.
std::vector<std::string> filesOf(const std::string& dir, const std::string& prefix) {
  std::vector<std::string> out;
  for (const std::string& name : ipc::testing::listDirectory(dir)) {
    if (name.rfind(prefix, 0) == 0) out.push_back(name);
  }
  std::sort(out.begin(), out.end());
  return out;
}

TEST(ZeroCheckpoint, ShardFilesAndAManifestResumeAnywhereLikeStageZerosWholeCheckpoint) {
  ipc::testing::ScopedShmDir shm;
  const std::string dir = shm.path();
  runJob(2, {.zero = 0, .lastStep = 12, .checkpoint = dir + "/whole.ckpt"});
  runJob(2, {.zero = 1, .lastStep = 12, .checkpoint = dir + "/sharded.ckpt"});
  // Two shard files and the manifest; nothing whole.
  EXPECT_EQ(filesOf(dir, "sharded.ckpt"), (std::vector<std::string>{"sharded.ckpt", "sharded.ckpt.g1.rank0-of-2.safetensors",
                                                                    "sharded.ckpt.g1.rank1-of-2.safetensors"}));
  const nn::Checkpoint manifest = nn::readCheckpoint(dir + "/sharded.ckpt");
  EXPECT_TRUE(nn::isShardedManifest(manifest));
  EXPECT_TRUE(manifest.tensors.empty()) << "a GPT has no buffers";
  const nn::Checkpoint whole = nn::readCheckpoint(dir + "/whole.ckpt");
  expectSameState(readWhole(dir + "/sharded.ckpt"), whole, "the sharded checkpoint assembled");
  EXPECT_EQ(readWhole(dir + "/sharded.ckpt").metadata.at("step"), "12");
  // The same state written asynchronously after every step: the last commit is the same again.
  runJob(2, {.zero = 2, .lastStep = 12, .checkpoint = dir + "/async.ckpt", .asyncEveryStep = true});
  expectSameState(readWhole(dir + "/async.ckpt"), whole, "the asynchronous checkpoint");
  EXPECT_EQ(filesOf(dir, "async.ckpt").size(), 3u) << "older generations removed";

  for (const auto& [ranks, zero] : {std::pair{1, 0}, std::pair{3, 2}, std::pair{4, 1}}) {
    const std::string to = "-w" + std::to_string(ranks) + "-zero" + std::to_string(zero);
    for (const std::string from : {"whole", "sharded"}) {
      runJob(ranks, {.zero = zero, .lastStep = 18, .loadFrom = dir + "/" + from + ".ckpt",
                     .checkpoint = dir + "/" + from + to + ".ckpt", .paramsOut = dir + "/" + from + to + ".params"});
    }
    const std::vector<float> a = cohort::testing::readFloats(dir + "/whole" + to + ".params.rank0");
    const std::vector<float> b = cohort::testing::readFloats(dir + "/sharded" + to + ".params.rank0");
    ASSERT_GT(a.size(), 1000u) << to;
    ASSERT_EQ(a.size(), b.size()) << to;
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << "resumed on" << to;
    expectSameState(readWhole(dir + "/sharded" + to + ".ckpt"), readWhole(dir + "/whole" + to + ".ckpt"),
                    "the resumed runs' checkpoints" + to);
  }
}

TEST(ZeroCheckpoint, TheModelsBuffersSurviveInTheManifest) {
  ipc::testing::ScopedShmDir shm;
  const std::string dir = shm.path();
  runJob(2, {.zero = 1, .model = "cnn:lenet-bn", .lastStep = 3, .checkpoint = dir + "/bn.ckpt",
             .buffersOut = dir + "/saved"});
  const nn::Checkpoint manifest = nn::readCheckpoint(dir + "/bn.ckpt");
  ASSERT_FALSE(manifest.tensors.empty()) << "the buffers are in the manifest";
  const nn::Checkpoint whole = readWhole(dir + "/bn.ckpt", "cnn:lenet-bn");
  // Rank 0's running statistics (each rank's follow its own batches), as a whole checkpoint keeps.
  for (const char* name : {"bn0.running_mean", "bn0.running_var", "bn1.running_mean", "bn1.running_var"}) {
    const std::vector<float> saved = cohort::testing::readFloats(dir + "/saved.rank0." + name);
    const runtime::Tensor* t = whole.find(name);
    ASSERT_NE(t, nullptr) << name;
    ASSERT_EQ(static_cast<size_t>(t->numel()), saved.size()) << name;
    EXPECT_EQ(std::memcmp(t->data(), saved.data(), saved.size() * sizeof(float)), 0) << name;
  }
  // Loaded on one rank at stage 0 (assembled whole) and on 2 at stage 2 (resharded): the same buffers.
  runJob(1, {.zero = 0, .model = "cnn:lenet-bn", .lastStep = 3, .loadFrom = dir + "/bn.ckpt", .buffersOut = dir + "/w1"});
  runJob(2, {.zero = 2, .model = "cnn:lenet-bn", .lastStep = 3, .loadFrom = dir + "/bn.ckpt", .buffersOut = dir + "/w2"});
  for (const std::string loaded : {"/w1.rank0.", "/w2.rank0.", "/w2.rank1."}) {
    EXPECT_EQ(cohort::testing::readFloats(dir + loaded + "bn1.running_var"),
              cohort::testing::readFloats(dir + "/saved.rank0.bn1.running_var"))
        << loaded;
  }
}

// Job::load refuses a sharded checkpoint of another model as it refuses a whole one, before
// changing anything, and an asynchronous save outside a sharded job is refused.
TEST(ZeroCheckpoint, ASavedShardedCheckpointIsValidatedLikeAWholeOne) {
  ipc::testing::ScopedShmDir shm;
  const std::string dir = shm.path();
  runJob(2, {.zero = 1, .lastStep = 2, .checkpoint = dir + "/gpt.ckpt"});
  testing::runRanks(1, [&](const runtime::WorldInfo& world) {
    Job job({.mode = Mode::kAllReduce, .backend = Backend::kShm, .zero = 1}, world);
    auto model = nn::buildModel("gpt:layers=1,heads=2,dim=32,ctx=8,vocab=40");
    auto optimizer = nn::makeOptimizer({.kind = nn::OptimizerKind::kAdamW}, model->params.numel());
    job.place(*model, *optimizer, {.seed = 3});
    try {
      job.load(dir + "/gpt.ckpt");
      return 10;
    } catch (const InvalidArgument& e) {
      if (std::string(e.what()).find("written with model") == std::string::npos) return 11;
    }
    return 0;
  });
  testing::runRanks(1, [&](const runtime::WorldInfo& world) {
    Job job({.mode = Mode::kLocal}, world);
    auto model = nn::buildModel(testing::kShardedRunModel);
    auto optimizer = nn::makeOptimizer({.kind = nn::OptimizerKind::kAdamW}, model->params.numel());
    job.place(*model, *optimizer, {.seed = 3});
    try {
      job.save(dir + "/local.ckpt", {}, {.async = true});
      return 20;
    } catch (const InvalidArgument&) {
    }
    return job.load(dir + "/gpt.ckpt") ? 0 : 21;  // a sharded checkpoint into a job that is not sharded
  });
}

}  // namespace
}  // namespace cohort::train
