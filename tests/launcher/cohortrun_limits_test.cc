// cohortrun and the shell around it (issue 44, items 19 and 20): Ctrl-Z stops the workers with
// cohortrun and fg continues them all, without the stop eating a grace period; a `ulimit -n` too low
// for the workers is a usage error (exit 2) naming both numbers, after raising the soft limit to the
// hard one where that is enough. Each test has its own temporary directory as COHORT_SHM_DIR.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>

#include <chrono>
#include <fstream>
#include <thread>

#include "tests/launcher/launcher_test_support.h"

namespace cohort::launcher::testing {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using Clock = std::chrono::steady_clock;

bool contains(const std::string& text, const std::string& needle) { return text.find(needle) != std::string::npos; }

class CohortrunLimitsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = freshTempDir();
    shmDir_ = dir_ + "/shm";
    go_ = dir_ + "/go";
    ASSERT_EQ(::mkdir(shmDir_.c_str(), 0700), 0);
  }
  Child start(const std::vector<std::string>& launcherArgs, const std::vector<std::string>& workerArgs,
              const StartOptions& options) {
    std::vector<std::string> argv = {cohortrun()};
    argv.insert(argv.end(), launcherArgs.begin(), launcherArgs.end());
    argv.push_back("--");
    argv.push_back(testWorker());
    argv.insert(argv.end(), workerArgs.begin(), workerArgs.end());
    return Child::start(argv, {"COHORT_SHM_DIR=" + shmDir_}, options);
  }
  void letWorkersFinish() const { std::ofstream(go_) << "go\n"; }
  // Waits until all `n` workers wait for the go file, then returns their pids.
  std::vector<pid_t> awaitWaiting(Child& child, size_t n) const {
    child.readUntil([&](const Output& o) { return linesWith(o.out, "] waiting for " + go_).size() == n; }, seconds(20));
    return workerPids(child.output().out);
  }
  // Ctrl-Z: SIGTSTP to cohortrun; it and every worker must come to a stop.
  static void stopJob(const Child& child, const std::vector<pid_t>& workers) {
    ASSERT_EQ(::kill(child.pid(), SIGTSTP), 0);
    for (pid_t pid : workers) ASSERT_TRUE(waitUntilStopped(pid, seconds(10))) << "worker " << pid << " was not stopped";
    ASSERT_TRUE(waitUntilStopped(child.pid(), seconds(10))) << "cohortrun did not stop itself";
  }

  std::string dir_, shmDir_, go_;
};

// Before: the workers, in process groups of their own, ran on while cohortrun sat stopped.
TEST_F(CohortrunLimitsTest, CtrlZStopsEveryWorkerAndSigcontContinuesThemToTheEnd) {
  Child child = start({"--nproc-per-node", "3"}, {"--await-file", go_}, {.ownProcessGroup = true});
  const std::vector<pid_t> workers = awaitWaiting(child, 3);
  ASSERT_EQ(workers.size(), 3u) << child.output().describe();
  ASSERT_NO_FATAL_FAILURE(stopJob(child, workers));
  letWorkersFinish();                          // acted on only once they run again
  ASSERT_EQ(::kill(child.pid(), SIGCONT), 0);  // fg
  const Output& r = child.finish(seconds(30));
  EXPECT_EQ(r.exitCode, 0) << r.describe();
  EXPECT_FALSE(contains(r.err, "SIGKILL")) << r.describe();
  for (pid_t pid : workers) EXPECT_TRUE(processGone(pid)) << "worker pid " << pid << " outlived cohortrun";
}

// A grace period running when the job is stopped is not used up while it is stopped: the workers,
// which ignore SIGTERM but leave once the go file exists, get the rest of it after SIGCONT. Before,
// cohortrun SIGKILLed them the moment it was continued.
TEST_F(CohortrunLimitsTest, TimeStoppedDoesNotCountAgainstTheGracePeriod) {
  Child child = start({"--nproc-per-node", "2", "--grace-period", "2"}, {"--ignore-sigterm", "--await-file", go_},
                      {.ownProcessGroup = true});
  const std::vector<pid_t> workers = awaitWaiting(child, 2);
  ASSERT_EQ(workers.size(), 2u) << child.output().describe();
  ASSERT_EQ(::kill(child.pid(), SIGTERM), 0);
  child.readUntil([](const Output& o) { return contains(o.err, "forwarding it to the workers"); }, seconds(20));
  const auto stopped = Clock::now();
  ASSERT_NO_FATAL_FAILURE(stopJob(child, workers));
  // What is tested is time passing while stopped (longer than the grace period), not an ordering.
  std::this_thread::sleep_until(stopped + milliseconds(2500));
  letWorkersFinish();
  ASSERT_EQ(::kill(child.pid(), SIGCONT), 0);
  const Output& r = child.finish(seconds(30));
  EXPECT_EQ(r.exitCode, 143) << r.describe();
  EXPECT_FALSE(contains(r.err, "sending SIGKILL")) << r.describe();
}

// Before: exit 1, "cohortrun: pipe2: Too many open files" (an internal error) partway through.
TEST_F(CohortrunLimitsTest, AnOpenFileLimitTooLowForTheWorkersIsAUsageError) {
  Child child = start({"--nproc-per-node", "4"}, {}, {.openFilesSoft = 16, .openFilesHard = 16});
  const Output& r = child.finish(seconds(30));
  EXPECT_EQ(r.exitCode, 2) << r.describe();
  EXPECT_TRUE(contains(r.err, "cohortrun: error: this job needs ")) << r.describe();
  EXPECT_TRUE(contains(r.err, " file descriptors for 4 worker(s) ")) << r.describe();
  EXPECT_TRUE(contains(r.err, "the limit of open files is 16 (ulimit -n; hard limit 16)")) << r.describe();
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.describe();
  EXPECT_TRUE(linesWith(r.out, "] pid ").empty()) << "no worker may start\n" << r.describe();
}

// A soft limit below the need and a hard one above it: raised, and the job runs.
TEST_F(CohortrunLimitsTest, ALowSoftLimitIsRaisedToTheHardLimit) {
  Child child = start({"--nproc-per-node", "4"}, {"--print", "1"}, {.openFilesSoft = 16, .openFilesHard = 1024});
  const Output& r = child.finish(seconds(30));
  EXPECT_EQ(r.exitCode, 0) << r.describe();
  EXPECT_EQ(workerPids(r.out).size(), 4u) << r.describe();
}

}  // namespace
}  // namespace cohort::launcher::testing
