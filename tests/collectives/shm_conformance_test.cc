// Runs the conformance worker under cohortrun for world sizes 1-4 (every collective, in place and
// out of place, many counts, exact checks; see conformance_worker.cc) on ordinary, shared and mixed
// buffers, each job with a fresh COHORT_SHM_DIR that must be empty afterwards.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tests/collectives/job_runner.h"

namespace cohort::collectives::testing {
namespace {

class ShmConformance : public ::testing::TestWithParam<int> {};

// Runs the worker on n ranks with `buffers` (user | shared | mixed) and a fresh COHORT_SHM_DIR.
void expectConformance(int n, const std::string& buffers, const std::vector<std::string>& env = {}) {
  const std::string shmDir = freshDir("shm");
  std::vector<std::string> environment = env;
  environment.push_back("COHORT_SHM_DIR=" + shmDir);
  JobResult job = runJob({runfile("launcher/cohortrun"), "--nproc-per-node", std::to_string(n), "--",
                          runfile("tests/collectives/conformance_worker"), "--backend", "shm", "--buffers", buffers},
                         environment, std::chrono::seconds(180));
  EXPECT_FALSE(job.timedOut) << job.output;
  EXPECT_EQ(job.exitCode, 0) << job.output;
  EXPECT_EQ(linesWith(job.output, " 0 failure(s)").size(), static_cast<size_t>(n)) << job.output;
  std::string left;
  EXPECT_TRUE(dirIsEmpty(shmDir, &left)) << "left in " << shmDir << ": " << left;
}

TEST_P(ShmConformance, EveryCollectivePasses) { expectConformance(GetParam(), "user"); }

// Buffers from allocateBuffer: large all-reduces take the direct path (no staging), and every
// buffer's segment is gone by the end.
TEST_P(ShmConformance, EveryCollectivePassesOnSharedBuffers) { expectConformance(GetParam(), "shared"); }

// Shared buffers on even ranks only: all ranks must still agree on the staged path.
TEST_P(ShmConformance, EveryCollectivePassesOnMixedBuffers) {
  if (GetParam() == 1) GTEST_SKIP() << "one rank cannot mix";
  expectConformance(GetParam(), "mixed");
}

// Small chunks: many chunks per collective, uneven last chunks, slot reuse across collectives, on
// both all-reduce paths.
TEST_P(ShmConformance, EveryCollectivePassesWithSmallChunks) {
  if (GetParam() == 1) GTEST_SKIP() << "one rank has no chunks (the collective is a copy)";
  expectConformance(GetParam(), "user", {"COHORT_SHM_CHUNK_BYTES=16384"});
  expectConformance(GetParam(), "shared", {"COHORT_SHM_CHUNK_BYTES=16384"});
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, ShmConformance, ::testing::Values(1, 2, 3, 4),
                         [](const ::testing::TestParamInfo<int>& info) { return "n" + std::to_string(info.param); });

}  // namespace
}  // namespace cohort::collectives::testing
