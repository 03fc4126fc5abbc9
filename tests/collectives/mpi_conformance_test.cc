// The conformance suite (conformance_worker, every collective with exact data, fp32 and bf16, NCCL's
// in-place layout, dtype mismatch) under mpirun, for world sizes 1 to 4: on the mpi backend, and on
// the hierarchical backend with the ranks as simulated nodes (--simulate-nodes), so that both of
// its levels run: 2 nodes of 1 (no node level), 1 node of 3 (no level across nodes), 2 nodes of 2.
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

struct Layout {
  int ranks;
  int nodes;
};

class HierarchicalConformanceTest : public ::testing::TestWithParam<Layout> {};

TEST_P(HierarchicalConformanceTest, EveryCollectiveIsExact) {
  const Layout layout = GetParam();
  MpirunResult r = runMpirun({.ranks = layout.ranks,
                              .argv = {runfile("tests/collectives/conformance_worker"), "--backend", "hierarchical",
                                       "--simulate-nodes", std::to_string(layout.nodes), "--timeout-ms", "60000"},
                              .timeout = std::chrono::seconds(240)});
  ASSERT_FALSE(r.timedOut) << r.output;
  EXPECT_EQ(r.exitCode, 0) << r.output;
  for (int rank = 0; rank < layout.ranks; ++rank) {
    const std::string line = "rank " + std::to_string(rank) + ": conformance hierarchical on " +
                             std::to_string(layout.ranks) + " ranks, user buffers: 0 failure(s)";
    EXPECT_NE(r.output.find(line), std::string::npos) << r.output;
  }
}

INSTANTIATE_TEST_SUITE_P(Nodes, HierarchicalConformanceTest,
                         ::testing::Values(Layout{1, 1}, Layout{2, 2}, Layout{3, 1}, Layout{4, 2}),
                         [](const ::testing::TestParamInfo<Layout>& info) {
                           return "n" + std::to_string(info.param.ranks) + "_nodes" + std::to_string(info.param.nodes);
                         });

}  // namespace
}  // namespace cohort::collectives::testing
