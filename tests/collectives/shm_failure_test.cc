// Failure behaviour of the shm backend (docs/collectives.md): mismatched collectives, a killed rank,
// a rank that never arrives. Ranks run as separate processes started from here (so each rank's exit
// code and message can be checked) and under cohortrun (which must blame the killed rank).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tests/collectives/job_runner.h"

namespace cohort::collectives::testing {
namespace {

struct RankRun {
  int exitCode = 0;
  std::string output;
  double seconds = 0;
};

// Starts fault_worker as ranks 0..n-1 of one job (cohortrun's variables, fresh job id and shm dir).
std::vector<RankRun> runRanks(int n, const std::string& mode, int timeoutMs, std::chrono::milliseconds limit) {
  static int job = 0;
  const std::string shmDir = freshDir("shm");
  const std::string jobId = "faulttest-" + std::to_string(getpid()) + "-" + std::to_string(job++);
  std::vector<pid_t> pids;
  std::vector<std::string> outputs;
  const auto start = std::chrono::steady_clock::now();
  for (int r = 0; r < n; ++r) {
    outputs.push_back(shmDir + ".rank" + std::to_string(r) + ".txt");
    pids.push_back(
        spawnJob({runfile("tests/collectives/fault_worker"), "--backend", "shm", "--mode", mode, "--timeout-ms",
                  std::to_string(timeoutMs)},
                 {"RANK=" + std::to_string(r), "LOCAL_RANK=" + std::to_string(r), "WORLD_SIZE=" + std::to_string(n),
                  "LOCAL_WORLD_SIZE=" + std::to_string(n), "COHORT_JOB_ID=" + jobId, "COHORT_SHM_DIR=" + shmDir},
                 outputs.back()));
  }
  std::vector<RankRun> runs(n);
  for (int r = 0; r < n; ++r) {
    runs[r].exitCode = waitChild(pids[r], limit);
    runs[r].seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    runs[r].output = readFile(outputs[r]);
  }
  EXPECT_TRUE(dirIsEmpty(shmDir)) << "segments left in " << shmDir;
  return runs;
}

TEST(ShmFailure, MismatchedCountsFailOnEveryRankNamingBothFingerprints) {
  const std::string expected =
      "collective mismatch: rank 0 issued #3 allreduce(sum, float32, 1000 elements) but rank 1 issued #3 "
      "allreduce(sum, float32, 999 elements)";
  for (int n : {2, 3}) {
    auto runs = runRanks(n, "mismatch-count", 20000, std::chrono::seconds(30));
    for (int r = 0; r < n; ++r) {
      EXPECT_EQ(runs[r].exitCode, 2) << "rank " << r << ": " << runs[r].output;
      EXPECT_NE(runs[r].output.find(expected), std::string::npos) << "rank " << r << ": " << runs[r].output;
      EXPECT_LT(runs[r].seconds, 10.0);
    }
  }
}

TEST(ShmFailure, DifferentCollectivesFailOnEveryRank) {
  const std::string expected =
      "collective mismatch: rank 0 issued #3 allreduce(sum, float32, 1000 elements) but rank 1 issued #3 "
      "broadcast(root 0, float32, 1000 elements)";
  auto runs = runRanks(3, "mismatch-kind", 20000, std::chrono::seconds(30));
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(runs[r].exitCode, 2) << "rank " << r << ": " << runs[r].output;
    EXPECT_NE(runs[r].output.find(expected), std::string::npos) << "rank " << r << ": " << runs[r].output;
  }
}

TEST(ShmFailure, KilledRankIsAPeerErrorNamingIt) {
  auto runs = runRanks(3, "kill", 30000, std::chrono::seconds(40));
  EXPECT_EQ(runs[1].exitCode, -9) << runs[1].output;
  for (int r : {0, 2}) {
    EXPECT_EQ(runs[r].exitCode, 4) << "rank " << r << ": " << runs[r].output;
    EXPECT_NE(runs[r].output.find("rank 1 (pid "), std::string::npos) << runs[r].output;
    EXPECT_NE(runs[r].output.find(") died during collective #3 allreduce(sum, float32, 33554432 elements)"),
              std::string::npos)
        << runs[r].output;
    EXPECT_LT(runs[r].seconds, 10.0) << "the survivors must not wait for the 30 s timeout";
  }
}

// The direct path on shared buffers: the same error, and no buffer segment left (no launcher here
// to sweep the job's names).
TEST(ShmFailure, KilledRankDuringDirectAllReduceIsAPeerErrorNamingIt) {
  auto runs = runRanks(3, "kill-shared", 30000, std::chrono::seconds(40));
  EXPECT_EQ(runs[1].exitCode, -9) << runs[1].output;
  for (int r : {0, 2}) {
    EXPECT_EQ(runs[r].exitCode, 4) << "rank " << r << ": " << runs[r].output;
    EXPECT_NE(runs[r].output.find(") died during collective #"), std::string::npos) << runs[r].output;
    EXPECT_NE(runs[r].output.find("allreduce(sum, float32, 33554432 elements)"), std::string::npos) << runs[r].output;
    EXPECT_LT(runs[r].seconds, 10.0) << "the survivors must not wait for the 30 s timeout";
  }
}

TEST(ShmFailure, AllocateBufferWithDifferentCountsFailsOnEveryRank) {
  auto runs = runRanks(3, "alloc-mismatch", 20000, std::chrono::seconds(30));
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(runs[r].exitCode, 2) << "rank " << r << ": " << runs[r].output;
    EXPECT_NE(runs[r].output.find("allocateBuffer is collective, but rank 0 asked for 1000 floats and rank 1 for 999"),
              std::string::npos)
        << "rank " << r << ": " << runs[r].output;
  }
}

// Repeated: the survivors must let cohortrun reap the killed rank before they exit with code 4.
TEST(ShmFailure, CohortrunBlamesTheKilledRank) {
  for (int attempt = 0; attempt < 3; ++attempt) {
    const std::string shmDir = freshDir("shm");
    JobResult job =
        runJob({runfile("launcher/cohortrun"), "--nproc-per-node", "3", "--", runfile("tests/collectives/fault_worker"),
                "--backend", "shm", "--mode", "kill", "--timeout-ms", "30000"},
               {"COHORT_SHM_DIR=" + shmDir}, std::chrono::seconds(60));
    EXPECT_EQ(job.exitCode, 137) << job.output;
    EXPECT_NE(job.output.find("cohortrun: rank 1 (pid "), std::string::npos) << job.output;
    EXPECT_NE(job.output.find("terminated by signal 9 (SIGKILL)"), std::string::npos) << job.output;
    EXPECT_LT(job.seconds, 20.0) << job.output;
    EXPECT_TRUE(dirIsEmpty(shmDir));
  }
}

TEST(ShmFailure, MissingRankIsATimeoutNamingItAndTheSequence) {
  auto runs = runRanks(2, "skip", 1000, std::chrono::seconds(30));
  EXPECT_EQ(runs[0].exitCode, 3) << runs[0].output;
  EXPECT_NE(runs[0].output.find("collective #3 allreduce(sum, float32, 1000 elements) timed out after 1.0 s on rank 0: "
                                "rank 1 of 2 did not issue it"),
            std::string::npos)
      << runs[0].output;
  EXPECT_EQ(runs[1].exitCode, 0) << runs[1].output;
}

}  // namespace
}  // namespace cohort::collectives::testing
