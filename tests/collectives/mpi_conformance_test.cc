// The conformance suite (conformance_worker, every collective with exact data) on the mpi backend,
// under mpirun, for world sizes 1 to 4.
#include <gtest/gtest.h>

#include "tests/collectives/mpi_run.h"

namespace cohort::collectives::testing {
namespace {

class MpiConformanceTest : public ::testing::TestWithParam<int> {};

TEST_P(MpiConformanceTest, EveryCollectiveIsExact) {
  const int ranks = GetParam();
  MpirunResult r =
      runMpirun({.ranks = ranks,
                 .argv = {runfile("tests/collectives/conformance_worker"), "--backend", "mpi", "--timeout-ms", "60000"},
                 .timeout = std::chrono::seconds(240)});
  ASSERT_FALSE(r.timedOut) << r.output;
  EXPECT_EQ(r.exitCode, 0) << r.output;
  for (int rank = 0; rank < ranks; ++rank) {
    const std::string line =
        "rank " + std::to_string(rank) + ": conformance mpi on " + std::to_string(ranks) + " ranks, user buffers: 0 failure(s)";
    EXPECT_NE(r.output.find(line), std::string::npos) << r.output;
  }
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, MpiConformanceTest, ::testing::Values(1, 2, 3, 4));

}  // namespace
}  // namespace cohort::collectives::testing
