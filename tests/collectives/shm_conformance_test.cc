// Runs the conformance worker under cohortrun for world sizes 1-4 (every collective, in place and
// out of place, many counts, exact checks; see conformance_worker.cc), each job with a fresh
// COHORT_SHM_DIR that must be empty afterwards.
#include <gtest/gtest.h>

#include <string>

#include "tests/collectives/job_runner.h"

namespace cohort::collectives::testing {
namespace {

class ShmConformance : public ::testing::TestWithParam<int> {};

TEST_P(ShmConformance, EveryCollectivePasses) {
  const int n = GetParam();
  const std::string shmDir = freshDir("shm");
  JobResult job = runJob({runfile("launcher/cohortrun"), "--nproc-per-node", std::to_string(n), "--",
                          runfile("tests/collectives/conformance_worker"), "--backend", "shm"},
                         {"COHORT_SHM_DIR=" + shmDir}, std::chrono::seconds(120));
  EXPECT_FALSE(job.timedOut) << job.output;
  EXPECT_EQ(job.exitCode, 0) << job.output;
  EXPECT_EQ(linesWith(job.output, " 0 failure(s)").size(), static_cast<size_t>(n)) << job.output;
  std::string left;
  EXPECT_TRUE(dirIsEmpty(shmDir, &left)) << "left in " << shmDir << ": " << left;
}

// Small chunks: many chunks per collective, uneven last chunks, slot reuse across collectives.
TEST_P(ShmConformance, EveryCollectivePassesWithSmallChunks) {
  const int n = GetParam();
  if (n == 1) GTEST_SKIP() << "one rank has no chunks (the collective is a copy)";
  const std::string shmDir = freshDir("shm");
  JobResult job = runJob({runfile("launcher/cohortrun"), "--nproc-per-node", std::to_string(n), "--",
                          runfile("tests/collectives/conformance_worker"), "--backend", "shm"},
                         {"COHORT_SHM_DIR=" + shmDir, "COHORT_SHM_CHUNK_BYTES=16384"}, std::chrono::seconds(180));
  EXPECT_FALSE(job.timedOut) << job.output;
  EXPECT_EQ(job.exitCode, 0) << job.output;
  EXPECT_TRUE(dirIsEmpty(shmDir));
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, ShmConformance, ::testing::Values(1, 2, 3, 4),
                         [](const ::testing::TestParamInfo<int>& info) { return "n" + std::to_string(info.param); });

}  // namespace
}  // namespace cohort::collectives::testing
