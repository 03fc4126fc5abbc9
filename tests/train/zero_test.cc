// ZeRO stages train to stage 0's parameters (issue 46, "Same training"): 2, 3 and 4 ranks over shm
// train a GPT with AdamW, clipping by the global norm (it clips: the limit is below the norms) and
// 2 micro-batches per step, each rank on its own tokens, for 50 steps, at stage 0 (replicas) and at
// stages 1 and 2; every rank's parameters are then compared with stage 0's rank 0: within 1e-6
// relative (the bound), and over shm bit for bit (the reduce-scatter adds the ranks in the
// all-reduce's order, rank order; the norm's sum runs over the pieces instead of the whole buffer,
// which could move the clip coefficient's last bit, and here does not).
// A world of 3 does not divide the units (padded pieces); 4 gives ranks pieces of the small units
// that are all padding. Every rank of a sharded job must also hold the same parameters (the
// all-gather) bit for bit. A skipped step (a non-finite loss on one rank) is skipped alike at every
// stage.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "nn/loss.h"
#include "nn/model_spec.h"
#include "nn/optimizer.h"
#include "tests/support/process.h"
#include "tests/train/ranks.h"
#include "tests/support/float_file.h"
#include "train/job.h"

namespace cohort::train {
namespace {

using runtime::Shape;
using runtime::Tensor;

constexpr char kModel[] = "gpt:layers=2,heads=2,dim=32,ctx=8,vocab=40";
constexpr int kSteps = 50, kMicroBatches = 2;

// Token ids of (rank, step, micro-batch) as a [2, 9] window: inputs are its first 8, targets its last.
std::vector<float> window(int rank, int step, int micro) {
  std::vector<float> ids(18);
  for (size_t i = 0; i < ids.size(); ++i) {
    ids[i] = static_cast<float>((static_cast<int>(i) * 7 + rank * 11 + step * 5 + micro * 3 + (step * step) % 13) % 40);
  }
  return ids;
}

struct ZeroRun {
  int zero = 0;
  int ranks = 2;
  std::string dir;
};

std::string pathOf(const ZeroRun& run, int rank) {
  return run.dir + "/zero" + std::to_string(run.zero) + "-w" + std::to_string(run.ranks) + "-rank" +
         std::to_string(rank) + ".bin";
}

int trainRank(const ZeroRun& run, const runtime::WorldInfo& world) {
  Job job({.mode = Mode::kAllReduce, .backend = Backend::kShm, .paramCopies = ParamCopies::kReplicas, .zero = run.zero},
          world);
  auto model = nn::buildModel(kModel);
  auto optimizer = nn::makeOptimizer({.kind = nn::OptimizerKind::kAdamW, .lr = 3e-3f, .weightDecay = 0.1f},
                                     model->params.numel());
  job.place(*model, *optimizer, {.seed = 7});
  nn::SoftmaxCrossEntropy loss;
  Tensor x = Tensor::zeros(Shape{2, 8}), y = Tensor::zeros(Shape{2, 8});
  for (int step = 0; step < kSteps; ++step) {
    double lossSum = 0;
    for (int k = 0; k < kMicroBatches; ++k) {
      const std::vector<float> ids = window(world.rank, step, k);
      for (int b = 0; b < 2; ++b) {
        for (int t = 0; t < 8; ++t) {
          x.at(b * 8 + t) = ids[static_cast<size_t>(b * 9 + t)];
          y.at(b * 8 + t) = ids[static_cast<size_t>(b * 9 + t + 1)];
        }
      }
      nn::Pass pass = job.pass({.microBatch = k, .microBatches = kMicroBatches});
      lossSum += loss.forward(model->forward(x, pass), y);
      model->net->backward(loss.backward(), pass);
    }
    // Step 20 on rank 1: a non-finite loss, skipped by every rank alike.
    const double mine = world.rank == 1 && step == 20 ? NAN : lossSum / kMicroBatches;
    const StepResult r = job.step({.clipGradNorm = 0.5f, .loss = mine, .skipNonFinite = 1});
    if (r.applied != (step != 20)) return 10 + step;
  }
  if (job.optimizer().steps() != kSteps - 1) return 3;
  const Tensor& v = model->params.values();
  return cohort::testing::writeFloats(pathOf(run, world.rank), {v.data(), static_cast<size_t>(v.numel())}) ? 0 : 1;
}

using cohort::testing::readFloats;

struct Difference {
  size_t bitsDiffer = 0;
  double worstRelative = 0;  // |a - b| / max(|b|, 1e-3)
};

Difference compare(const std::vector<float>& a, const std::vector<float>& b) {
  Difference d;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::memcmp(&a[i], &b[i], sizeof(float)) == 0) continue;
    ++d.bitsDiffer;
    d.worstRelative = std::max(d.worstRelative, std::fabs(double(a[i]) - b[i]) / std::max(std::fabs(double(b[i])), 1e-3));
  }
  return d;
}

TEST(Zero, StagesOneAndTwoTrainToStageZerosParameters) {
  ipc::testing::ScopedShmDir shm;
  for (int ranks : {2, 3, 4}) {
    for (int zero : {0, 1, 2}) {
      const ZeroRun run{.zero = zero, .ranks = ranks, .dir = shm.path()};
      SCOPED_TRACE("zero " + std::to_string(zero) + ", " + std::to_string(ranks) + " ranks");
      testing::runRanks(ranks, [&](const runtime::WorldInfo& world) { return trainRank(run, world); });
    }
    const std::vector<float> reference = readFloats(pathOf({.zero = 0, .ranks = ranks, .dir = shm.path()}, 0));
    ASSERT_GT(reference.size(), 1000u);
    for (int zero : {1, 2}) {
      const ZeroRun run{.zero = zero, .ranks = ranks, .dir = shm.path()};
      const std::vector<float> rank0 = readFloats(pathOf(run, 0));
      ASSERT_EQ(rank0.size(), reference.size());
      const Difference d = compare(rank0, reference);
      EXPECT_LE(d.worstRelative, 1e-6) << "zero " << zero << ", " << ranks << " ranks";
      // shm adds every element in rank order in both collectives (collectives/shm/shm_engine.h,
      // rankOrder), so the averages are stage 0's bits; the norm's double sum (pieces, not the whole
      // buffer) rounds to the same float clip coefficient here. Deterministic: same inputs, same bits.
      EXPECT_EQ(d.bitsDiffer, 0u) << "zero " << zero << ", " << ranks << " ranks over shm";
      std::printf("zero %d, %d ranks: %zu of %zu parameters differ from stage 0's bits, worst relative %.3g\n", zero,
                  ranks, d.bitsDiffer, reference.size(), d.worstRelative);
      for (int r = 1; r < ranks; ++r) {
        EXPECT_EQ(compare(readFloats(pathOf(run, r)), rank0).bitsDiffer, 0u) << "zero " << zero << " rank " << r;
      }
    }
  }
}

}  // namespace
}  // namespace cohort::train
