// Ranks of one job started with different settings (issue 15): every rank fails at once, exit 2,
// naming both ranks and the first differing setting with both values, before any training step —
// over shm (one shared copy and --replicas), under mpirun (MPMD, the mpi backend) and in Hogwild. The ranks
// here are started by hand with cohortrun's variables (as a user's own launcher would) or by
// mpirun, so nothing but the workers themselves can stop the job.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "tests/cli/cli_test_support.h"

namespace cohort::testing {
namespace {

// Where these ranks run: the message names each rank's host (issue 33).
std::string hostName() {
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  return host;
}

using Clock = std::chrono::steady_clock;

std::vector<std::string> train(const std::vector<std::string>& extra) {
  std::vector<std::string> a = {cohortBinary(), "train", "--data", "synthetic", "--epochs", "1", "--threads", "1",
                                "--timeout", "60"};
  a.insert(a.end(), extra.begin(), extra.end());
  if (std::find(a.begin(), a.end(), "--model") == a.end()) a.insert(a.end(), {"--model", "mlp:784,32,10"});
  return a;
}

class AgreementCliTest : public ShmDirTest {
 protected:
  // Starts rank r with train(flags[r]) as one job of flags.size() ranks, all at once; returns
  // their results and prints how long the last to exit took after the last one started.
  std::vector<CommandResult> runRanks(const std::vector<std::vector<std::string>>& flags) {
    const int n = static_cast<int>(flags.size());
    std::vector<CommandResult> results(flags.size());
    std::vector<Clock::time_point> started(flags.size()), ended(flags.size());
    std::vector<std::thread> threads;
    const std::string job = "agree-" + std::to_string(::getpid()) + "-" + std::to_string(runs_++);
    for (int r = 0; r < n; ++r) {
      threads.emplace_back([&, r] {
        started[r] = Clock::now();
        results[r] = runCommand(train(flags[r]),
                                {.timeout = std::chrono::seconds(90),
                                 .extraEnvironment = {"RANK=" + std::to_string(r), "LOCAL_RANK=" + std::to_string(r),
                                                      "WORLD_SIZE=" + std::to_string(n), "LOCAL_WORLD_SIZE=" + std::to_string(n),
                                                      "COHORT_JOB_ID=" + job, "COHORT_SHM_DIR=" + shm_}});
        ended[r] = Clock::now();
      });
    }
    for (auto& t : threads) t.join();
    const auto lastStart = *std::max_element(started.begin(), started.end());
    const auto lastEnd = *std::max_element(ended.begin(), ended.end());
    reportedAfter_ = std::chrono::duration<double>(lastEnd - lastStart).count();
    std::printf("the last rank exited %.3f s after the last one started\n", reportedAfter_);
    return results;
  }

  // Every rank exited 2 with the one message naming `setting` and both values.
  void expectRefused(const std::vector<CommandResult>& results, const std::string& message) {
    for (size_t r = 0; r < results.size(); ++r) {
      EXPECT_EQ(results[r].exitCode, 2) << results[r].describe();
      EXPECT_NE(results[r].stderrText.find(message), std::string::npos) << "want: " << message << "\n" << results[r].describe();
      EXPECT_EQ(results[r].stdoutText.find("RESULT"), std::string::npos) << results[r].describe();
      EXPECT_EQ(results[r].stdoutText.find("epoch 1"), std::string::npos) << "trained: " << results[r].describe();
    }
    // Not a timeout: the workers' start-up (data, model) plus a barrier. Generous for a loaded
    // 2-core machine; measured about 0.5 s.
    EXPECT_LT(reportedAfter_, 10.0);
    EXPECT_TRUE(listDir(shm_).empty()) << "shared memory left behind";
  }

  int runs_ = 0;
  double reportedAfter_ = 0;
};

TEST_F(AgreementCliTest, SharedCopyRanksWithAnotherBatchSizeAreRefused) {
  auto results = runRanks({{"--mode", "allreduce", "--batch-size", "64"}, {"--mode", "allreduce", "--batch-size", "32"}});
  expectRefused(results, "ranks 0 (" + hostName() + ") and 1 (" + hostName() + ") were started with different settings: batch_size is 64 on rank 0 but 32 on rank 1");
}

TEST_F(AgreementCliTest, ReplicasWithAnotherLearningRateAreRefused) {
  auto results = runRanks({{"--mode", "allreduce", "--replicas", "--lr", "0.05"}, {"--mode", "allreduce", "--replicas", "--lr", "0.5"}});
  expectRefused(results, "lr is 0.05 on rank 0 but 0.5 on rank 1");
}

TEST_F(AgreementCliTest, HogwildWorkersWithAnotherModelAreRefused) {
  auto results = runRanks({{"--mode", "hogwild"}, {"--mode", "hogwild", "--model", "mlp:784,64,10"}});
  expectRefused(results, "model is mlp:784,32,10 on rank 0 but mlp:784,64,10 on rank 1");
}

TEST_F(AgreementCliTest, TheFirstDifferingRankOfThreeIsNamedAndTheCountGiven) {
  auto results = runRanks({{"--mode", "allreduce", "--momentum", "0.9"},
                           {"--mode", "allreduce", "--momentum", "0.9"},
                           {"--mode", "allreduce", "--optimizer", "adam"}});
  expectRefused(results, "ranks 0 (" + hostName() + ") and 2 (" + hostName() + ") were started with different settings: optimizer is sgd on rank 0 but adam on rank 2");
}

TEST_F(AgreementCliTest, ModesThatDifferAreRefused) {
  auto results = runRanks({{"--mode", "allreduce"}, {"--mode", "hogwild"}});
  expectRefused(results, "mode is allreduce on rank 0 but hogwild on rank 1");
}

TEST_F(AgreementCliTest, MpirunMpmdRanksWithAnotherLearningRateAreRefused) {
  setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
  setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
  std::vector<std::string> argv = {"/usr/bin/mpirun", "--oversubscribe", "-x", "COHORT_SHM_DIR", "-np", "1"};
  for (const char* lr : {"0.05", "0.5"}) {
    if (std::string(lr) == "0.5") argv.insert(argv.end(), {":", "-np", "1"});
    for (const auto& a : train({"--mode", "allreduce", "--backend", "mpi", "--lr", lr, "--max-steps", "50"})) argv.push_back(a);
  }
  const auto start = Clock::now();
  CommandResult r = runCommand(argv, {.timeout = std::chrono::seconds(90)});
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  EXPECT_EQ(r.exitCode, 2) << r.describe();
  const std::string message = "ranks 0 (" + hostName() + ") and 1 (" + hostName() + ") were started with different settings: lr is 0.05 on rank 0 but 0.5 on rank 1";
  EXPECT_EQ(linesWith(r.stdoutText + r.stderrText, message).size(), 2u) << "every rank says it\n" << r.describe();
  EXPECT_EQ(r.stdoutText.find("RESULT"), std::string::npos) << r.describe();
  EXPECT_LT(seconds, 20.0);
  EXPECT_TRUE(listDir(shm_).empty()) << "shared memory left behind";
}

}  // namespace
}  // namespace cohort::testing
