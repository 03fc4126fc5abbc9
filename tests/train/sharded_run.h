// One rank of a small sharded training run for the tests of sharded checkpoints in training
// (zero_checkpoint_test.cc, zero_checkpoint_kill_test.cc): a GPT (or any spec) trained with AdamW
// over shm at a given ZeRO stage, each rank on tokens that are a pure function of (rank, step), so
// that a run resumed at step k continues exactly as the uninterrupted one. It loads a checkpoint
// first where asked, saves where asked (at the end, after every step synchronously to a reference
// directory, or asynchronously after every step), and can tell a parent through a pipe when it has
// a committed checkpoint. Returns 0, or a code naming the failed expectation (tests/ipc/multiproc.h).
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include "nn/checkpoint.h"
#include "nn/loss.h"
#include "nn/model_spec.h"
#include "nn/optimizer.h"
#include "nn/sharded_checkpoint.h"
#include "runtime/world_info.h"
#include "tests/support/float_file.h"
#include "train/job.h"

namespace cohort::train::testing {

inline constexpr char kShardedRunModel[] = "gpt:layers=2,heads=2,dim=32,ctx=8,vocab=40";

struct ShardedRun {
  int zero = 1;
  std::string model = kShardedRunModel;
  int lastStep = 10;               // trains until the step count reaches it
  std::string loadFrom = {};       // a checkpoint to resume from (its metadata "step"), if it exists
  std::string checkpoint = {};     // saved at the end (synchronously), or after every step (async)
  bool asyncEveryStep = false;     // checkpoint: saved asynchronously after every step
  std::string referenceDir = {};   // saved synchronously after every step to referenceDir/step<k>.ckpt
  int reportFd = -1;               // gets one byte once a checkpoint is committed (or loaded)
  std::string paramsOut = {};      // the final parameters, rank <r> in paramsOut + ".rank<r>"
  std::string buffersOut = {};     // the final model buffers, as paramsOut
};

// The checkpoint at `path` (either kind) as one model of `spec`.
inline nn::Checkpoint readWholeCheckpoint(const std::string& path, const std::string& spec = kShardedRunModel) {
  return nn::readAnyCheckpoint(path, {.split = nn::buildModel(spec)->params.entries()});
}

// Every tensor of `expected` in `actual`, bit for bit, and the optimizer's step count (gtest
// expectations naming `what`).
inline void expectSameState(const nn::Checkpoint& actual, const nn::Checkpoint& expected, const std::string& what) {
  ASSERT_EQ(actual.tensors.size(), expected.tensors.size()) << what;
  for (const nn::NamedTensor& t : expected.tensors) {
    const runtime::Tensor* mine = actual.find(t.name);
    ASSERT_NE(mine, nullptr) << what << " lacks " << t.name;
    ASSERT_EQ(mine->numel(), t.tensor.numel()) << what << ": " << t.name;
    EXPECT_EQ(std::memcmp(mine->data(), t.tensor.data(), t.tensor.bytes()), 0) << what << ": " << t.name;
  }
  EXPECT_EQ(actual.metadata.at("optimizer_steps"), expected.metadata.at("optimizer_steps")) << what;
}

inline std::string referencePath(const std::string& dir, int step) { return dir + "/step" + std::to_string(step) + ".ckpt"; }

// Inputs and targets of one [2, T] batch of token ids for (rank, step): a pure function of both.
inline void shardedRunBatch(int rank, int step, runtime::Tensor& x, runtime::Tensor& y, int64_t context, int vocab) {
  for (int64_t i = 0; i < x.numel(); ++i) {
    const auto token = [&](int64_t at) {
      return static_cast<float>((at * 5 + rank * 13 + step * 7 + (at * step) % 11) % vocab);
    };
    const int64_t row = i / context, t = i % context;
    x.at(i) = token(row * (context + 1) + t);
    y.at(i) = token(row * (context + 1) + t + 1);
  }
}

inline int runShardedRank(const ShardedRun& run, const runtime::WorldInfo& world) {
  Job job({.mode = Mode::kAllReduce, .backend = Backend::kShm, .paramCopies = ParamCopies::kReplicas, .zero = run.zero},
          world);
  auto model = nn::buildModel(run.model);
  auto optimizer = nn::makeOptimizer({.kind = nn::OptimizerKind::kAdamW, .lr = 3e-3f, .weightDecay = 0.1f},
                                     model->params.numel());
  job.place(*model, *optimizer, {.seed = 3});
  int step = 0;
  const auto meta = run.loadFrom.empty() ? std::nullopt : job.load(run.loadFrom);
  if (meta) step = std::stoi(meta->at("step"));
  const auto save = [&](const std::string& path, bool async) {
    job.save(path, {{"step", std::to_string(step)}}, {.async = async});
  };
  if (!meta && run.asyncEveryStep) save(run.checkpoint, false);  // committed before the report
  if (!run.referenceDir.empty() && !meta) save(referencePath(run.referenceDir, step), false);
  if (run.reportFd >= 0 && ::write(run.reportFd, "1", 1) != 1) return 2;
  nn::SoftmaxCrossEntropy loss;
  const bool gpt = run.model.rfind("gpt:", 0) == 0;
  runtime::Tensor x = runtime::Tensor::zeros(gpt ? runtime::Shape{2, 8} : runtime::Shape{4, 784});
  runtime::Tensor y = runtime::Tensor::zeros(gpt ? runtime::Shape{2, 8} : runtime::Shape{4});
  for (; step < run.lastStep;) {
    if (gpt) {
      shardedRunBatch(world.rank, step, x, y, 8, 40);
    } else {  // an image model: pixels and classes of (rank, step)
      for (int64_t i = 0; i < x.numel(); ++i) x.at(i) = static_cast<float>((i * 7 + world.rank * 3 + step) % 17) / 16.0f;
      for (int64_t i = 0; i < y.numel(); ++i) y.at(i) = static_cast<float>((i + world.rank + step) % 10);
    }
    nn::Pass pass = job.pass();
    loss.forward(model->forward(x, pass), y);
    model->net->backward(loss.backward(), pass);
    if (!job.step().applied) return 3;
    ++step;
    if (!run.referenceDir.empty()) save(referencePath(run.referenceDir, step), false);
    if (run.asyncEveryStep) {
      job.settleCheckpoint({.wait = false});
      save(run.checkpoint, true);
    }
  }
  if (run.asyncEveryStep) job.settleCheckpoint();
  if (!run.checkpoint.empty() && !run.asyncEveryStep) save(run.checkpoint, false);
  const std::string rank = ".rank" + std::to_string(world.rank);
  if (!run.paramsOut.empty()) {
    const runtime::Tensor& v = model->params.values();
    if (!cohort::testing::writeFloats(run.paramsOut + rank, {v.data(), static_cast<size_t>(v.numel())})) return 4;
  }
  for (size_t i = 0; !run.buffersOut.empty() && i < model->params.bufferEntries().size(); ++i) {
    const runtime::Tensor b = model->params.buffer(i);
    const std::string file = run.buffersOut + rank + "." + model->params.bufferEntries()[i].name;
    if (!cohort::testing::writeFloats(file, {b.data(), static_cast<size_t>(b.numel())})) return 5;
  }
  return 0;
}

}  // namespace cohort::train::testing
