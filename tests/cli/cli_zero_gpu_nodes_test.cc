// ZeRO across nodes on GPUs (issue 46, item 1: `--zero-scope node` over NCCL; tags = ["gpu", "mpi"]):
// 4 ranks under mpirun, played as 2 nodes of 2 GPUs on one machine. Each rank's environment says
// so in cohortrun's variables (RANK, LOCAL_RANK, LOCAL_WORLD_SIZE 2), each node has a directory of
// its own for its segments (COHORT_SHM_DIR: a node's /dev/shm) and GPUs of its own
// (CUDA_VISIBLE_DEVICES), and NCCL's unique id travels over MPI as across real nodes. On the emulated
// device every rank's NCCL meets in one directory (COHORT_CUDASIM_NCCL_DIR; real NCCL would cross
// the network). Stages 1, 2 and 3 with scope node (shards within each node, each piece averaged
// across the nodes) and stage 2 with scope job train an MLP (AdamW, clipping that clips, 2
// micro-batches) to the parameters of stage 0 over the same 4 GPUs: scope job bit for bit (the
// emulated NCCL adds every reduction in rank order), scope node within 1e-6 of each parameter (its two averages,
// ((a + b)/2 + (c + d)/2)/2, are not the one average (a + b + c + d)/4). Needs 4 CUDA devices
// (COHORT_CUDASIM_DEVICES=4 on the emulated device): skips, saying so, where there are fewer.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "nn/checkpoint.h"
#include "tests/cli/cli_test_support.h"

namespace cohort::testing {
namespace {

class ZeroGpuNodesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    CommandResult devices = runCommand({cohortBinary(), "devices"});
    ASSERT_EQ(devices.exitCode, 0) << devices.describe();
    const size_t at = devices.stdoutText.find("CUDA devices: ");
    if (at == std::string::npos || std::atoi(devices.stdoutText.c_str() + at + 14) < 4) {
      GTEST_SKIP() << "needs 4 CUDA devices: " << devices.stdoutText.substr(0, devices.stdoutText.find('\n', at));
    }
    dir_ = freshTempDir();
    for (const std::string& d : {dir_ + "/node0", dir_ + "/node1", dir_ + "/nccl"}) {
      ASSERT_EQ(::mkdir(d.c_str(), 0700), 0) << d;
    }
  }

  // 12 steps of `cohort train` on 2 played nodes of 2 GPUs, the parameters left at `checkpoint`.
  CommandResult train(const std::string& checkpoint, int zero, const std::string& scope) {
    const std::string job = "zgn-" + std::to_string(::getpid()) + "-" + std::to_string(runs_++);
    // Each rank's node from its MPI rank: node k runs ranks 2k and 2k + 1 on GPUs 2k and 2k + 1.
    const std::string play =
        "r=$OMPI_COMM_WORLD_RANK; n=$((r / 2)); export RANK=$r WORLD_SIZE=4 LOCAL_RANK=$((r % 2)) "
        "LOCAL_WORLD_SIZE=2 COHORT_JOB_ID=" +
        job + " COHORT_SHM_DIR=" + dir_ + "/node$n CUDA_VISIBLE_DEVICES=$((2 * n)),$((2 * n + 1)) COHORT_CUDASIM_NCCL_DIR=" +
        dir_ + "/nccl; exec \"$@\"";
    std::vector<std::string> argv = {"/usr/bin/mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np", "4",
                                     "/bin/sh", "-c", play, "play-node", cohortBinary(), "train", "--device", "cuda",
                                     "--mode", "allreduce", "--model", "mlp:784,64,10", "--data", "synthetic", "--seed", "5",
                                     "--optimizer", "adamw", "--lr", "0.01", "--weight-decay", "0.1", "--clip-grad-norm",
                                     "0.3", "--accumulate-steps", "2", "--batch-size", "8", "--max-steps", "12",
                                     "--progress-every", "0", "--checkpoint", checkpoint};
    if (zero > 0) {
      for (const std::string& a : {std::string("--zero"), std::to_string(zero), std::string("--zero-scope"), scope}) {
        argv.push_back(a);
      }
    }
    return runCommand(argv, {.timeout = std::chrono::seconds(300),
                             .extraEnvironment = {"OMPI_ALLOW_RUN_AS_ROOT=1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1"}});
  }

  std::string dir_;
  int runs_ = 0;
};

TEST_F(ZeroGpuNodesTest, ScopeNodeAndScopeJobTrainAsStageZeroOnTwoNodesOfTwoGpus) {
  const std::string reference = dir_ + "/zero0.st";
  CommandResult base = train(reference, 0, "job");
  ASSERT_EQ(base.exitCode, 0) << base.describe();
  for (int rank = 0; rank < 4; ++rank) {
    EXPECT_NE(base.stdoutText.find("rank " + std::to_string(rank) + " of 4 (local " + std::to_string(rank % 2) + " of 2)"),
              std::string::npos)
        << "rank " << rank << " is not local rank " << rank % 2 << " of a node of 2\n" << base.stdoutText;
  }
  struct Run {
    int zero;
    std::string scope;
    double tolerance;
  };
  for (const Run& run : {Run{1, "node", 1e-6}, Run{2, "node", 1e-6}, Run{3, "node", 1e-6}, Run{2, "job", 0}}) {
    const std::string name = "zero" + std::to_string(run.zero) + "-" + run.scope;
    const std::string path = dir_ + "/" + name + ".st";
    CommandResult r = train(path, run.zero, run.scope);
    ASSERT_EQ(r.exitCode, 0) << name << "\n" << r.describe();
    EXPECT_EQ(nn::readCheckpoint(path).metadata["step"], "12") << name;
    // Tolerance 0: every parameter bit for bit (the largest absolute difference is 0).
    EXPECT_EQ(expectSameParameters(reference, path, run.tolerance, "(" + name + " against stage 0 on 2 nodes of 2 GPUs)"), 4);
  }
}

}  // namespace
}  // namespace cohort::testing
