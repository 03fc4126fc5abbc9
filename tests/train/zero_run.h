// One rank of zero_test's training (issue 46, "The same training"), shared by zero_test (ranks as
// forked processes over shm) and zero_mpi_worker (ranks under mpirun, over mpi or hierarchical): a
// GPT trained with AdamW and weight decay, clipping by the global norm (it clips: the limit is below
// the norms) and 2 micro-batches per step, each rank on its own tokens, a non-finite loss on rank 1
// at step 20 (the step skipped), then a checkpoint of the job and this rank's parameters in a file of
// their own. Returns 0, or a code naming the failed expectation (tests/ipc/multiproc.h).
#pragma once

#include <cmath>
#include <string>
#include <vector>

#include "nn/loss.h"
#include "nn/model_spec.h"
#include "nn/optimizer.h"
#include "runtime/world_info.h"
#include "tests/support/float_file.h"
#include "tests/train/ranks.h"
#include "train/job.h"

namespace cohort::train::testing {

inline constexpr char kZeroRunModel[] = "gpt:layers=2,heads=2,dim=32,ctx=8,vocab=40";
inline constexpr int kZeroRunSteps = 50, kZeroRunMicroBatches = 2;

struct ZeroRun {
  int zero = 0;
  int ranks = 2;
  std::string dir;
  int firstStep = 0, steps = kZeroRunSteps;
  std::string resumeFrom = {};  // a checkpoint to load first
  std::string name = {};        // what the run is called in its files (default: zero<Z>-w<W>)
  Backend backend = Backend::kShm;
  ZeroScope scope = ZeroScope::kJob;
  std::string model = kZeroRunModel;  // a GPT of context 8 and vocabulary 40
  std::string label() const {
    return name.empty() ? "zero" + std::to_string(zero) + "-w" + std::to_string(ranks) : name;
  }
};

inline std::string pathOf(const ZeroRun& run, int rank) {
  return run.dir + "/" + run.label() + "-rank" + std::to_string(rank) + ".bin";
}
inline std::string checkpointOf(const ZeroRun& run) { return run.dir + "/" + run.label() + ".ckpt"; }

inline int trainZeroRank(const ZeroRun& run, const runtime::WorldInfo& world) {
  Job job({.mode = Mode::kAllReduce, .backend = run.backend, .paramCopies = ParamCopies::kReplicas, .zero = run.zero,
           .zeroScope = run.scope},
          world);
  auto model = nn::buildModel(run.model);
  auto optimizer = nn::makeOptimizer({.kind = nn::OptimizerKind::kAdamW, .lr = 3e-3f, .weightDecay = 0.1f},
                                     model->params.numel());
  job.place(*model, *optimizer, {.seed = 7});
  if (!run.resumeFrom.empty() && !job.load(run.resumeFrom)) return 4;
  nn::SoftmaxCrossEntropy loss;
  runtime::Tensor x = runtime::Tensor::zeros(runtime::Shape{2, 8}), y = runtime::Tensor::zeros(runtime::Shape{2, 8});
  for (int step = run.firstStep; step < run.firstStep + run.steps; ++step) {
    double lossSum = 0;
    for (int k = 0; k < kZeroRunMicroBatches; ++k) {
      const std::vector<float> ids = tokenWindow(world.rank, step, k, 40);  // [2, 9]: inputs first 8, targets last
      for (int b = 0; b < 2; ++b) {
        for (int t = 0; t < 8; ++t) {
          x.at(b * 8 + t) = ids[static_cast<size_t>(b * 9 + t)];
          y.at(b * 8 + t) = ids[static_cast<size_t>(b * 9 + t + 1)];
        }
      }
      nn::Pass pass = job.pass({.microBatch = k, .microBatches = kZeroRunMicroBatches});
      lossSum += loss.forward(model->forward(x, pass), y);
      model->net->backward(loss.backward(), pass);
    }
    const double mine = world.rank == 1 && step == 20 ? NAN : lossSum / kZeroRunMicroBatches;
    const StepResult r = job.step({.clipGradNorm = 0.5f, .loss = mine});
    if (r.applied != (step != 20)) return 10 + step;
  }
  // The optimizer state (AdamW: two floats an element) is the shard's: N/W elements and the padding
  // of at most W - 1 per unit, W the shard group's ranks (the node's with scope node).
  const size_t n = model->params.numel();
  const size_t w = static_cast<size_t>(run.scope == ZeroScope::kNode ? world.localWorldSize : world.worldSize);
  const size_t stateFloats = job.stateBytes().optimizer / sizeof(float);
  const size_t shardMax = run.zero == 0 ? n : (n + model->params.units().size() * (w - 1)) / w;
  if (stateFloats < 2 * (run.zero == 0 ? n : n / w) || stateFloats > 2 * shardMax) return 5;
  // Stages 2 and 3 keep the gradient's shard only, stage 3 the parameters' too (the windows are
  // staging).
  const StateBytes held = job.stateBytes();
  if (run.zero >= 2 && held.grads != held.optimizer / 2) return 6;
  if (run.zero == 3 && held.params != held.grads) return 7;
  if (run.zero < 2 && held.grads != model->params.bytes()) return 8;
  job.save(checkpointOf(run));
  const runtime::Tensor v = job.wholeParams();
  return cohort::testing::writeFloats(pathOf(run, world.rank), {v.data(), static_cast<size_t>(v.numel())}) ? 0 : 1;
}

}  // namespace cohort::train::testing
