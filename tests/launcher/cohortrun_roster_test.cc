// cohortrun and the job's roster (ipc/rank_roster.h, issue 33): a worker that exits 0 while others
// still run, in a job whose workers use the Cohort runtime, without having finished its Job, fails
// the job at once (exit 4, named); workers that finish at different times, and programs that never
// use the runtime, end normally. test_worker stands in for `cohort train`: --join-roster is its
// train::Job, --finish the Job's normal end.
#include <dirent.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <chrono>
#include <string>
#include <vector>

#include "tests/launcher/launcher_test_support.h"

namespace cohort::launcher::testing {
namespace {

using Clock = std::chrono::steady_clock;

bool contains(const std::string& text, const std::string& needle) { return text.find(needle) != std::string::npos; }

class CohortrunRosterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = freshTempDir();
    shmDir_ = dir_ + "/shm";
    ASSERT_EQ(::mkdir(shmDir_.c_str(), 0700), 0);
  }
  // Two workers: rank 0 runs test_worker with `rank0`, rank 1 with `rank1`; cohortrun to its end.
  Output run(const std::string& rank0, const std::string& rank1, const std::vector<std::string>& flags = {}) {
    const std::string w = "'" + testWorker() + "' ";
    const std::string script = "if [ \"$RANK\" = 0 ]; then exec " + w + rank0 + "; else exec " + w + rank1 + "; fi";
    std::vector<std::string> argv = {cohortrun(), "--nproc-per-node", "2", "--grace-period", "1"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    argv.insert(argv.end(), {"--", "/bin/sh", "-c", script});
    const auto start = Clock::now();
    Child child = Child::start(argv, {"COHORT_SHM_DIR=" + shmDir_});
    Output r = child.finish(std::chrono::seconds(60));
    seconds_ = std::chrono::duration<double>(Clock::now() - start).count();
    return r;
  }
  // In this user's private directory (ipc/private_dir.h), which stays, and beside it.
  void expectNothingLeft() const {
    std::string left;
    for (const std::string& dir : {shmDir_, shmDir_ + "/cohort-" + std::to_string(::geteuid())}) {
      DIR* d = ::opendir(dir.c_str());
      ASSERT_NE(d, nullptr) << dir;
      while (dirent* e = ::readdir(d)) {
        if (e->d_name[0] != '.' && dir + "/" + e->d_name != shmDir_ + "/cohort-" + std::to_string(::geteuid())) {
          left += std::string(" ") + e->d_name;
        }
      }
      ::closedir(d);
    }
    EXPECT_EQ(left, "") << "shared memory left behind";
  }

  std::string dir_, shmDir_;
  double seconds_ = 0;
};

TEST_F(CohortrunRosterTest, AWorkerThatExitsZeroBeforeTheJobFinishedFailsItAtOnce) {
  Output r = run("--join-roster --hang", "--join-roster");
  EXPECT_EQ(r.exitCode, 4) << r.describe();
  EXPECT_TRUE(contains(r.err, "cohortrun: rank 1 (pid ")) << r.describe();
  EXPECT_TRUE(contains(r.err, ") exited with code 0 before the job finished\n")) << r.describe();
  EXPECT_TRUE(contains(r.err, "cohortrun: stopping the other 1 worker(s)")) << r.describe();
  EXPECT_LT(seconds_, 10.0) << "rank 0 would have run until killed";
  expectNothingLeft();
}

TEST_F(CohortrunRosterTest, AnExitZeroBeforeAnyWorkerUsesTheRuntimeIsJudgedOnceOneDoes) {
  // Rank 1 exits 0 at once; rank 0 makes its Job only after rank 1 is gone.
  Output r = run("--outlive-peers --join-roster --hang", "");
  EXPECT_EQ(r.exitCode, 4) << r.describe();
  EXPECT_TRUE(contains(r.err, ") exited with code 0 before the job finished\n")) << r.describe();
  EXPECT_LT(seconds_, 10.0);
}

TEST_F(CohortrunRosterTest, AnEarlyExitIsRestartedLikeAnyFailure) {
  Output r = run("--join-roster --hang", "--join-roster", {"--max-restarts", "1"});
  EXPECT_EQ(r.exitCode, 4) << r.describe();
  EXPECT_TRUE(contains(r.err,
                       "cohortrun: restarting the group (attempt 2 of 2) after rank 1 exited with code 0 before the "
                       "job finished\n"))
      << r.describe();
}

TEST_F(CohortrunRosterTest, WorkersThatFinishTheirJobsAtDifferentTimesSucceed) {
  Output r = run("--outlive-peers --join-roster --steps 2 --finish", "--join-roster --finish");
  EXPECT_EQ(r.exitCode, 0) << r.describe();
  EXPECT_FALSE(contains(r.err, "cohortrun:")) << r.describe();
  EXPECT_TRUE(contains(r.out, "[rank 0] step 1\n")) << "rank 0 ran on after rank 1 ended\n" << r.describe();
  expectNothingLeft();
}

TEST_F(CohortrunRosterTest, AProgramWithoutTheRuntimeMayEndItsRanksInAnyOrder) {
  Output r = run("--outlive-peers --steps 2", "");
  EXPECT_EQ(r.exitCode, 0) << r.describe();
  EXPECT_FALSE(contains(r.err, "cohortrun:")) << r.describe();
  EXPECT_TRUE(contains(r.out, "[rank 0] step 1\n")) << r.describe();
  expectNothingLeft();
}

}  // namespace
}  // namespace cohort::launcher::testing
