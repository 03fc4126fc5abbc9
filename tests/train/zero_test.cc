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

#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "nn/checkpoint.h"
#include "nn/model_spec.h"
#include "nn/sharded_checkpoint.h"
#include "tests/support/process.h"
#include "tests/support/float_file.h"
#include "tests/train/ranks.h"
#include "tests/train/zero_run.h"
#include "train/job.h"

namespace cohort::train {
namespace {

using runtime::Tensor;

constexpr auto kModel = testing::kZeroRunModel;
using testing::checkpointOf;
using testing::pathOf;
using testing::ZeroRun;

void train(const ZeroRun& run) {
  SCOPED_TRACE(run.label());
  testing::runRanks(run.ranks, [&](const runtime::WorldInfo& world) { return testing::trainZeroRank(run, world); });
}

using cohort::testing::readFloats;

using Difference = cohort::testing::FloatDifference;
constexpr auto compare = cohort::testing::compareFloats;

TEST(Zero, StagesOneAndTwoTrainToStageZerosParameters) {
  ipc::testing::ScopedShmDir shm;
  for (int ranks : {2, 3, 4}) {
    for (int zero : {0, 1, 2, 3}) train({.zero = zero, .ranks = ranks, .dir = shm.path()});
    const ZeroRun stage0{.zero = 0, .ranks = ranks, .dir = shm.path()};
    const std::vector<float> reference = readFloats(pathOf(stage0, 0));
    ASSERT_GT(reference.size(), 1000u);
    const nn::Checkpoint referenceCheckpoint = nn::readCheckpoint(checkpointOf(stage0));
    for (int zero : {1, 2, 3}) {
      const ZeroRun run{.zero = zero, .ranks = ranks, .dir = shm.path()};
      const std::vector<float> rank0 = readFloats(pathOf(run, 0));
      ASSERT_EQ(rank0.size(), reference.size());
      const Difference d = compare(rank0, reference);
      EXPECT_LE(d.worstRelative, 1e-6) << run.label();
      // shm adds every element in rank order in both collectives (collectives/shm/shm_engine.h,
      // rankOrder), so the averages are stage 0's bits; the norm's double sum (pieces, not the whole
      // buffer) rounds to the same float clip coefficient here. Deterministic: same inputs, same bits.
      EXPECT_EQ(d.bitsDiffer, 0u) << run.label() << " over shm";
      std::printf("%s: %zu of %zu parameters differ from stage 0's bits, worst relative %.3g\n", run.label().c_str(),
                  d.bitsDiffer, reference.size(), d.worstRelative);
      for (int r = 1; r < ranks; ++r) EXPECT_EQ(compare(readFloats(pathOf(run, r)), rank0).bitsDiffer, 0u) << r;
      // The checkpoint (sharded: a shard file per rank), assembled whole: every tensor stage 0's bits.
      const nn::Checkpoint checkpoint =
          nn::readAnyCheckpoint(checkpointOf(run), {.split = nn::buildModel(kModel)->params.entries()});
      ASSERT_EQ(checkpoint.tensors.size(), referenceCheckpoint.tensors.size()) << run.label();
      for (const nn::NamedTensor& t : referenceCheckpoint.tensors) {
        const Tensor* mine = checkpoint.find(t.name);
        ASSERT_NE(mine, nullptr) << run.label() << " lacks " << t.name;
        ASSERT_EQ(mine->numel(), t.tensor.numel()) << t.name;
        EXPECT_EQ(std::memcmp(mine->data(), t.tensor.data(), t.tensor.bytes()), 0) << run.label() << ": " << t.name;
      }
    }
  }
}

// A sharded checkpoint resumes on another world size and stage (elastic resume): stages 1 and 3 on
// 2 ranks saved after 25 steps, resumed for 10 more on 4 ranks at stage 2, on 3 ranks at stage 3
// and on 1 rank at stage 0, end where the same resumes of stage 0's checkpoint end, bit for bit.
TEST(Zero, ACheckpointResumesOnAnotherWorldSizeAndStage) {
  ipc::testing::ScopedShmDir shm;
  const std::string dir = shm.path();
  for (int zero : {0, 1, 3}) {
    train({.zero = zero, .ranks = 2, .dir = dir, .steps = 25, .name = "first" + std::to_string(zero)});
  }
  for (const auto& [ranks, zero] : {std::pair{4, 2}, std::pair{3, 3}, std::pair{1, 0}}) {
    const auto name = [&](int from) {
      return "from" + std::to_string(from) + "-w" + std::to_string(ranks) + "-zero" + std::to_string(zero);
    };
    for (int from : {0, 1, 3}) {
      train({.zero = zero, .ranks = ranks, .dir = dir, .firstStep = 25, .steps = 10,
             .resumeFrom = dir + "/first" + std::to_string(from) + ".ckpt", .name = name(from)});
    }
    const std::vector<float> fromStage0 = readFloats(dir + "/" + name(0) + "-rank0.bin");
    ASSERT_GT(fromStage0.size(), 1000u);
    for (int from : {1, 3}) {
      EXPECT_EQ(compare(readFloats(dir + "/" + name(from) + "-rank0.bin"), fromStage0).bitsDiffer, 0u)
          << "stage " << from << "'s checkpoint resumed on " << ranks << " ranks at stage " << zero;
    }
  }
}

}  // namespace
}  // namespace cohort::train
