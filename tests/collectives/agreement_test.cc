// collectives::compareAcrossRanks under mpirun (agreement_worker), over shared memory and over MPI,
// 1 to 4 ranks: ranks that agree, ranks that differ (every rank learns the same first differing rank,
// the count and both sides' bytes), and a rank that never takes part (a timeout naming it, not a hang).
#include <gtest/gtest.h>
#include <unistd.h>

#include <string>
#include <tuple>

#include "tests/collectives/mpi_run.h"

namespace cohort::collectives::testing {
namespace {

class AgreementTest : public ::testing::TestWithParam<std::tuple<std::string, int>> {
 protected:
  MpirunResult run(const std::string& scenario, int ranks, const std::string& timeoutMs = "30000") {
    return runMpirun({.ranks = ranks,
                      .argv = {runfile("tests/collectives/agreement_worker"), "--transport", std::get<0>(GetParam()),
                               "--scenario", scenario, "--timeout-ms", timeoutMs},
                      .timeout = std::chrono::seconds(60)});
  }
};

TEST_P(AgreementTest, RanksWithTheSameBytesAgree) {
  const int ranks = std::get<1>(GetParam());
  MpirunResult r = run("same", ranks);
  ASSERT_FALSE(r.timedOut) << r.output;
  EXPECT_EQ(r.exitCode, 0) << r.output;
  for (int rank = 0; rank < ranks; ++rank) {
    EXPECT_NE(r.output.find("AGREED rank=" + std::to_string(rank) + " reference=settings of the job\n"), std::string::npos)
        << r.output;
  }
}

TEST_P(AgreementTest, EveryRankLearnsTheFirstDifferingRankAndBothSides) {
  const int ranks = std::get<1>(GetParam());
  if (ranks == 1) GTEST_SKIP() << "one rank cannot differ";
  MpirunResult r = run("differ", ranks);
  ASSERT_FALSE(r.timedOut) << r.output;
  EXPECT_EQ(r.exitCode, 0) << r.output;
  const int first = ranks == 2 ? 1 : 2, count = ranks - first;
  char name[256] = {};
  ::gethostname(name, sizeof name - 1);
  const std::string host = name;
  for (int rank = 0; rank < ranks; ++rank) {
    const std::string want = "DIFFER rank=" + std::to_string(rank) + " first=" + std::to_string(first) +
                             " count=" + std::to_string(count) +
                             " reference=settings of the job differing=settings of rank " + std::to_string(first) +
                             " hosts=" + host + "," + host + "\n";  // both sides name where they run
    EXPECT_NE(r.output.find(want), std::string::npos) << want << "\n" << r.output;
  }
}

TEST_P(AgreementTest, ARankThatNeverComesIsATimeoutNotAHang) {
  const int ranks = std::get<1>(GetParam());
  if (ranks == 1) GTEST_SKIP() << "needs an absent rank 1";
  MpirunResult r = run("absent", ranks, "300");
  ASSERT_FALSE(r.timedOut) << r.output;
  EXPECT_NE(r.exitCode, 0) << r.output;
  // The first rank to give up exits, and a launcher then ends the job: the other waiting ranks may
  // be killed before they report, so at least one of them must have (rank 1 never comes).
  EXPECT_NE(r.output.find("ERROR rank="), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("ERROR rank=1 "), std::string::npos) << r.output;
  // Over shared memory the barrier names the missing rank; over MPI the agreement.
  if (std::get<0>(GetParam()) == "shm") {
    EXPECT_NE(r.output.find("barrier 'agreement-test' timed out after 0.3 s: rank 1 of " + std::to_string(ranks)),
              std::string::npos)
        << r.output;
  } else {
    EXPECT_NE(r.output.find("agreement 'agreement-test' (over MPI): not every rank arrived within 0.3 s"),
              std::string::npos)
        << r.output;
  }
}

INSTANTIATE_TEST_SUITE_P(TransportsAndWorldSizes, AgreementTest,
                         ::testing::Combine(::testing::Values("shm", "mpi"), ::testing::Values(1, 2, 3, 4)),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_" + std::to_string(std::get<1>(info.param)) + "ranks";
                         });

}  // namespace
}  // namespace cohort::collectives::testing
