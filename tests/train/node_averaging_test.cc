// train::NodeAveraging (Hogwild across nodes) under mpirun, every rank a node of one worker
// (node_averaging_worker): the first node's parameters reach every node; two overlapped rounds and
// the full average end, to the bit, as the rule says (copy += average - snapshot keeps the updates
// made while a round runs), on 2 and 4 nodes; a meeting without steps changes nothing; and nodes
// whose leaders started different numbers of rounds get an InvalidArgument on every rank, not a hang.
#include <gtest/gtest.h>

#include <string>

#include "tests/collectives/mpi_run.h"

namespace cohort::collectives::testing {
namespace {

class NodeAveragingTest : public ::testing::TestWithParam<int> {};

TEST_P(NodeAveragingTest, RoundsKeepTheUpdatesMadeMeanwhileAndEveryNodeEndsEqual) {
  const int ranks = GetParam();
  MpirunResult r =
      runMpirun({.ranks = ranks, .argv = {runfile("tests/train/node_averaging_worker"), "--scenario", "rule"}});
  ASSERT_FALSE(r.timedOut) << r.output;
  EXPECT_EQ(r.exitCode, 0) << r.output;
  for (int rank = 0; rank < ranks; ++rank) {
    EXPECT_NE(r.output.find("OK rank=" + std::to_string(rank) + "\n"), std::string::npos) << r.output;
  }
}

TEST_P(NodeAveragingTest, LeadersThatStartedDifferentRoundsAreRefusedOnEveryRank) {
  const int ranks = GetParam();
  MpirunResult r =
      runMpirun({.ranks = ranks,
                 .argv = {runfile("tests/train/node_averaging_worker"), "--scenario", "uneven", "--timeout-ms", "2000"},
                 .timeout = std::chrono::seconds(60)});
  ASSERT_FALSE(r.timedOut) << r.output;
  for (int rank = 0; rank < ranks; ++rank) {
    EXPECT_NE(r.output.find("MISMATCH rank=" + std::to_string(rank) +
                            " Hogwild across nodes: the leader of rank 0's node started 1 averaging rounds since the "
                            "last meeting and rank 1's 0"),
              std::string::npos)
        << r.output;
  }
}

INSTANTIATE_TEST_SUITE_P(Nodes, NodeAveragingTest, ::testing::Values(2, 4));

}  // namespace
}  // namespace cohort::collectives::testing
