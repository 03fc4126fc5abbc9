// Job::reduce is one reduce: every rank's doubles gathered as raw bits and added in rank order, so
// the same figures give the same bits in every mode (replicas included, which went through float32
// before) and on every rank: values a float cannot hold (0.1 + 1e-9, a third, 1e300) come back
// exactly as the rank-order sum, mean and max of the ranks' values.
#include <gtest/gtest.h>

#include <bit>
#include <cstdint>
#include <vector>

#include "nn/model_spec.h"
#include "nn/optimizer.h"
#include "tests/support/process.h"
#include "tests/train/ranks.h"
#include "train/job.h"

namespace cohort::train {
namespace {

using ipc::testing::ScopedShmDir;

std::vector<double> valuesOf(int rank) {
  const double r = rank + 1;
  return {0.1 + 1e-9 * r, r / 3.0, 1e300 * r, -r * 1e-310, 0.1 * r + 0.7};
}

// The reduction as the job must make it: rows added in rank order.
std::vector<double> expected(int ranks, Reduce op) {
  std::vector<double> acc = valuesOf(0);
  for (int r = 1; r < ranks; ++r) {
    const std::vector<double> v = valuesOf(r);
    for (size_t i = 0; i < acc.size(); ++i) acc[i] = op == Reduce::kMax ? std::max(acc[i], v[i]) : acc[i] + v[i];
  }
  if (op == Reduce::kMean) {
    for (double& a : acc) a /= ranks;
  }
  return acc;
}

int reduceRank(const JobOptions& options, const runtime::WorldInfo& world) {
  auto model = nn::buildModel("mlp:4,3");
  Job job(options, world);
  auto optimizer = nn::makeOptimizer({.lr = 0.1f}, model->params.numel());
  job.place(*model, *optimizer, {.seed = 1});
  int code = 30;
  for (Reduce op : {Reduce::kSum, Reduce::kMean, Reduce::kMax}) {
    std::vector<double> values = valuesOf(world.rank);
    job.reduce(values, op);
    const std::vector<double> want = expected(world.worldSize, op);
    for (size_t i = 0; i < values.size(); ++i) {
      if (std::bit_cast<uint64_t>(values[i]) != std::bit_cast<uint64_t>(want[i])) return code + static_cast<int>(i);
    }
    code += 10;
  }
  return 0;
}

TEST(JobReduce, TheSameBitsInEveryMode) {
  ScopedShmDir shm;
  const JobOptions modes[] = {
      {.mode = Mode::kAllReduce, .backend = Backend::kShm, .paramCopies = ParamCopies::kReplicas},
      {.mode = Mode::kAllReduce, .backend = Backend::kShm, .paramCopies = ParamCopies::kSharedPerNode},
      {.mode = Mode::kHogwild},
  };
  for (int ranks : {2, 3}) {
    for (const JobOptions& options : modes) {
      SCOPED_TRACE(std::to_string(ranks) + " ranks, " + toString(options.mode) + ", " + toString(options.paramCopies));
      testing::runRanks(ranks, [&](const runtime::WorldInfo& world) { return reduceRank(options, world); });
    }
  }
  testing::runRanks(1, [&](const runtime::WorldInfo& world) { return reduceRank({}, world); });
}

}  // namespace
}  // namespace cohort::train
