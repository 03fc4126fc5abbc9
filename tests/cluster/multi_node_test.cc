// Ranks on different (simulated) hosts train correctly (issue 19): 2 nodes x 2 workers in allreduce
// over mpi, each node with its own hostname, network, /dev/shm and process tree, end with the
// parameters of one worker with the combined batch (1e-5 after 20 steps); every world line names its
// host; nothing is left in any node's /dev/shm (each node's is a tmpfs that goes with it, so the
// check is the cluster's own: `down` leaves no namespace or process behind).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "nn/checkpoint.h"
#include "tests/cli/cli_test_support.h"
#include "tests/support/process.h"

namespace cohort::testing {
namespace {

std::vector<std::string> trainArgs(int batch, const std::string& checkpoint) {
  return {cohortBinary(), "train", "--data", "synthetic", "--model", "mlp:784,64,10", "--lr", "0.05", "--momentum", "0.9",
          "--seed", "5", "--threads", "1", "--batch-size", std::to_string(batch), "--max-steps", "20",
          "--checkpoint", checkpoint, "--progress-every", "0"};
}

class MultiNodeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = freshTempDir();  // under the test's TEST_TMPDIR: the host's file system, which every node shares
    cluster_ = runfile("scripts/cluster");
    // A cluster of this test's own (names, state, lock), so it never meets another run's.
    env_ = {"COHORT_CLUSTER_NAME=cmn" + std::to_string(::getpid() % 100000)};
    CommandResult check = runCommand({cluster_, "check"}, {.extraEnvironment = env_});
    if (check.exitCode == 77) GTEST_SKIP() << "no simulated cluster on this machine: " << check.stdoutText << check.stderrText;
    ASSERT_EQ(check.exitCode, 0) << check.describe();
  }
  // `run` tears the cluster down itself, except when it is killed (a timeout here): then this does.
  void TearDown() override {
    if (!cluster_.empty()) runCommand({cluster_, "down"}, {.extraEnvironment = env_});
  }
  std::string dir_, cluster_;
  std::vector<std::string> env_;
};

TEST_F(MultiNodeTest, TwoNodesOfTwoWorkersEqualOneWorkerWithTheCombinedBatch) {
  const std::string many = dir_ + "/many.st", one = dir_ + "/one.st";
  std::vector<std::string> argv = {cluster_, "run", "2", "--rate", "1gbit", "--", "mpirun", "--allow-run-as-root",
                                   "--oversubscribe", "--bind-to", "none", "--host", "cohort-node0:2,cohort-node1:2",
                                   "-np", "4"};
  for (const std::string& a : trainArgs(8, many)) argv.push_back(a);
  for (const char* a : {"--mode", "allreduce", "--backend", "mpi"}) argv.push_back(a);
  CommandResult r = runCommand(argv, {.timeout = std::chrono::seconds(240), .extraEnvironment = env_});
  ASSERT_EQ(r.exitCode, 0) << r.describe();
  for (int rank = 0; rank < 4; ++rank) {
    const std::string host = "cohort-node" + std::to_string(rank / 2);
    EXPECT_NE(r.stdoutText.find("rank " + std::to_string(rank) + " of 4 (local " + std::to_string(rank % 2) + " of 2) on " + host),
              std::string::npos)
        << "rank " << rank << " on " << host << "\n" << r.stdoutText;
  }
  EXPECT_EQ(parseResultLine(r.stdoutText).fields["backend"], "mpi");

  CommandResult s = runCommand(trainArgs(32, one), {.timeout = std::chrono::seconds(240)});
  ASSERT_EQ(s.exitCode, 0) << s.describe();
  EXPECT_EQ(nn::readCheckpoint(many).metadata["step"], "20");
  EXPECT_EQ(expectSameParameters(one, many, 1e-5, "(2 nodes x 2 workers)"), 4);
  CommandResult status = runCommand({cluster_, "status"}, {.extraEnvironment = env_});
  EXPECT_NE(status.stdoutText.find(": down"), std::string::npos) << "the cluster is gone: " << status.describe();
}

}  // namespace
}  // namespace cohort::testing
