// The mpi backend under mpirun with mpi_smoke_worker: every collective, exact data, world sizes
// 1 to 4, WorldInfo::detect() seeing Open MPI's ranks, and the MPI rendezvous store.
#include <gtest/gtest.h>

#include "tests/collectives/mpi_run.h"

namespace cohort::collectives::testing {
namespace {

class MpiSmokeTest : public ::testing::TestWithParam<int> {};

TEST_P(MpiSmokeTest, EveryCollectiveIsExact) {
  const int ranks = GetParam();
  MpirunResult r =
      runMpirun({.ranks = ranks, .argv = {runfile("tests/collectives/mpi_smoke_worker"), "--scenario", "ok"}});
  ASSERT_FALSE(r.timedOut) << r.output;
  EXPECT_EQ(r.exitCode, 0) << r.output;
  for (int rank = 0; rank < ranks; ++rank) {
    EXPECT_NE(
        r.output.find("WORLD rank=" + std::to_string(rank) + " size=" + std::to_string(ranks) + " source=openmpi"),
        std::string::npos)
        << r.output;
    EXPECT_NE(r.output.find("OK rank=" + std::to_string(rank) + "\n"), std::string::npos) << r.output;
  }
}

TEST_P(MpiSmokeTest, TheMpiStoreServesEveryRankBesideTheCommunicator) {
  const int ranks = GetParam();
  MpirunResult r =
      runMpirun({.ranks = ranks, .argv = {runfile("tests/collectives/mpi_smoke_worker"), "--scenario", "store"}});
  ASSERT_FALSE(r.timedOut) << r.output;
  EXPECT_EQ(r.exitCode, 0) << r.output;
  for (int rank = 0; rank < ranks; ++rank) {
    EXPECT_NE(r.output.find("OK rank=" + std::to_string(rank) + "\n"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("STORE-TIMEOUT rank=" + std::to_string(rank) + " store (mpi, rank " + std::to_string(rank) +
                            "): timed out after 0.2 s waiting for key 'nobody' (1 of 1 missing)"),
              std::string::npos)
        << r.output;
  }
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, MpiSmokeTest, ::testing::Values(1, 2, 3, 4));

}  // namespace
}  // namespace cohort::collectives::testing
