// ZeRO stages train to stage 0's parameters over mpi (issue 46, "The same training"): zero_test's
// training (tests/train/zero_run.h: a GPT, AdamW with weight decay, clipping that clips, 2
// micro-batches, a skipped step, 50 steps) on 2, 3 and 4 ranks under mpirun with --backend mpi and a
// replica per rank, at stages 0, 1, 2 and 3 (zero_mpi_worker). Every stage's rank 0 ends within 1e-6
// of stage 0's rank 0 in both relative differences (tests/support/float_file.h: max|a-b| / max|b|
// and ||a-b||_2 / ||b||_2), and bit for bit: stage 0's all-reduce is Open MPI's MPI_Iallreduce
// (libnbc, a binomial tree: ((r0+r1)+(r2+r3)) on 4 ranks, rank order on 2 and 3), and the mpi
// reduce-scatter adds the rows it receives in that same tree (collectives/mpi/mpi_data.cc,
// reduceRows). Every rank of a sharded job holds the same parameters, bit for bit.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "tests/collectives/mpi_run.h"
#include "tests/support/float_file.h"
#include "tests/support/process.h"

namespace cohort::testing {
namespace {

using collectives::testing::MpirunResult;
using collectives::testing::runMpirun;

std::string label(int ranks, int zero) { return "mpi-w" + std::to_string(ranks) + "-zero" + std::to_string(zero); }
std::string paramsOf(const std::string& dir, int ranks, int zero, int rank) {
  return dir + "/" + label(ranks, zero) + "-rank" + std::to_string(rank) + ".bin";
}

class ZeroMpiTest : public ::testing::TestWithParam<int> {};

TEST_P(ZeroMpiTest, StagesOneToThreeTrainToStageZerosParametersBitForBit) {
  const int ranks = GetParam();
  const std::string dir = freshTempDir();
  for (int zero = 0; zero <= 3; ++zero) {
    const MpirunResult r = runMpirun({.ranks = ranks,
                                      .argv = {runfile("tests/train/zero_mpi_worker"), "--zero", std::to_string(zero),
                                               "--backend", "mpi", "--dir", dir, "--name", label(ranks, zero)},
                                      .timeout = std::chrono::seconds(120)});
    ASSERT_FALSE(r.timedOut) << r.output;
    ASSERT_EQ(r.exitCode, 0) << label(ranks, zero) << "\n" << r.output;
    for (int rank = 0; rank < ranks; ++rank) {
      EXPECT_NE(r.output.find("OK rank=" + std::to_string(rank) + "\n"), std::string::npos) << r.output;
    }
  }
  const std::vector<float> reference = readFloats(paramsOf(dir, ranks, 0, 0));
  ASSERT_GT(reference.size(), 1000u);
  for (int zero = 1; zero <= 3; ++zero) {
    const std::vector<float> rank0 = readFloats(paramsOf(dir, ranks, zero, 0));
    ASSERT_EQ(rank0.size(), reference.size()) << label(ranks, zero);
    const FloatDifference d = compareFloats(rank0, reference);
    std::printf("%s: %zu of %zu parameters differ from stage 0's bits; relative difference %.3g (max norm), %.3g (L2)\n",
                label(ranks, zero).c_str(), d.bitsDiffer, reference.size(), d.maxNormRelative, d.l2Relative);
    EXPECT_LE(d.maxNormRelative, 1e-6) << label(ranks, zero);
    EXPECT_LE(d.l2Relative, 1e-6) << label(ranks, zero);
    EXPECT_EQ(d.bitsDiffer, 0u) << label(ranks, zero);
    for (int rank = 1; rank < ranks; ++rank) {
      EXPECT_EQ(compareFloats(readFloats(paramsOf(dir, ranks, zero, rank)), rank0).bitsDiffer, 0u)
          << label(ranks, zero) << ": rank " << rank << " against rank 0";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, ZeroMpiTest, ::testing::Values(2, 3, 4));

}  // namespace
}  // namespace cohort::testing
