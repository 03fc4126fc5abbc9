// ZeRO over the hierarchical backend on the simulated cluster (issue 46, "The same training"): 2
// nodes x 2 workers (links shaped to 1 Gbit/s) run zero_test's training (tests/train/zero_run.h: a
// GPT, AdamW with weight decay, clipping that clips, 2 micro-batches, a skipped step, 50 steps;
// tests/train/zero_mpi_worker) at stage 0 and at stages 1, 2 and 3 with --zero-scope job and node.
// The GPT is wider than zero_test's (dim 128): its blocks (198,272 parameters, 775 KiB) take the
// backend's two-level path (shm in the node, mpi across), its embeddings and ln_f (6,144 and 256)
// one MPI collective over the world (up to 256 KiB).
// Every run's rank 0 ends within 1e-6 of stage 0's in both relative differences (max|a-b| / max|b|
// and ||a-b||_2 / ||b||_2), and bit for bit: on 2 nodes of 2 every reduction adds (r0 + r1) +
// (r2 + r3) (the world's MPI_Iallreduce and the mpi reduce-scatter in Open MPI's binomial tree; two
// levels: each node's sum in rank order, then the two nodes'), and scope node's averages over the
// node and then across nodes scale by 1/2 twice, which is exact. Every rank holds the same
// parameters.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "tests/cli/cli_test_support.h"
#include "tests/cluster/cluster_test.h"
#include "tests/support/float_file.h"
#include "tests/support/process.h"

namespace cohort::testing {
namespace {

constexpr char kModel[] = "gpt:layers=2,heads=2,dim=128,ctx=8,vocab=40";

class ZeroClusterTest : public ClusterTest {
 protected:
  ZeroClusterTest() : ClusterTest("czr") {}
};

struct ZeroJob {
  int zero = 0;
  std::string scope = "job";
  std::string name() const { return "zero" + std::to_string(zero) + "-" + scope; }
};

TEST_F(ZeroClusterTest, StagesOneToThreeOverHierarchicalTrainToStageZerosParametersBitForBit) {
  const std::vector<ZeroJob> runs = {{0}, {1, "job"}, {2, "job"}, {3, "job"}, {1, "node"}, {2, "node"}, {3, "node"}};
  // One shell runs every job's mpirun inside one cluster, one after another.
  std::string jobs;
  for (const ZeroJob& run : runs) {
    jobs += std::string(jobs.empty() ? "" : " && ") +
            "mpirun --allow-run-as-root --oversubscribe --bind-to none --host cohort-node0:2,cohort-node1:2 -np 4 " +
            runfile("tests/train/zero_mpi_worker") + " --zero " + std::to_string(run.zero) +
            " --backend hierarchical --scope " + run.scope + " --model " + kModel + " --dir " + dir_ + " --name " +
            run.name();
  }
  const CommandResult r = runCommand({cluster_, "run", "2", "--rate", "1gbit", "--", "bash", "-c", jobs},
                                     {.timeout = std::chrono::seconds(400), .extraEnvironment = env_});
  ASSERT_EQ(r.exitCode, 0) << r.describe();
  EXPECT_EQ(linesWith(r.stdoutText, "OK rank=").size(), 4 * runs.size()) << r.stdoutText;

  const auto params = [&](const ZeroJob& run, int rank) {
    return readFloats(dir_ + "/" + run.name() + "-rank" + std::to_string(rank) + ".bin");
  };
  const std::vector<float> reference = params(runs[0], 0);
  ASSERT_GT(reference.size(), 400000u);
  for (size_t i = 1; i < runs.size(); ++i) {
    const std::vector<float> rank0 = params(runs[i], 0);
    ASSERT_EQ(rank0.size(), reference.size()) << runs[i].name();
    const FloatDifference d = compareFloats(rank0, reference);
    std::printf("hierarchical 2x2 %s: %zu of %zu parameters differ from stage 0's bits; relative difference %.3g "
                "(max norm), %.3g (L2)\n",
                runs[i].name().c_str(), d.bitsDiffer, reference.size(), d.maxNormRelative, d.l2Relative);
    EXPECT_LE(d.maxNormRelative, 1e-6) << runs[i].name();
    EXPECT_LE(d.l2Relative, 1e-6) << runs[i].name();
    EXPECT_EQ(d.bitsDiffer, 0u) << runs[i].name();
    for (int rank = 1; rank < 4; ++rank) {
      EXPECT_EQ(compareFloats(params(runs[i], rank), rank0).bitsDiffer, 0u) << runs[i].name() << ": rank " << rank;
    }
  }
}

}  // namespace
}  // namespace cohort::testing
