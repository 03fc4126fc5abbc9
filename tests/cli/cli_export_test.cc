// `cohort export` never replaces a training run's state (issue 44 item 15): not the checkpoint it
// reads, under any name (the same inode), and not a checkpoint whose lock a running job holds.
// Both are refused with exit 2 before anything is read or written.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "tests/cli/cli_test_support.h"

namespace cohort::testing {
namespace {

class ExportCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = freshTempDir();
    std::string text;
    while (text.size() < 4000) text += "the cat sees the river and a dog follows the red ball. ";
    writeFile(dir_ + "/corpus.txt", text);
    ckpt_ = dir_ + "/run.st";
    CommandResult r =
        runCohort({"train", "--model", "gpt:layers=1,heads=2,dim=32,ctx=16", "--data", "text:" + dir_ + "/corpus.txt",
                   "--max-steps", "1", "--threads", "1", "--progress-every", "0", "--checkpoint", ckpt_});
    ASSERT_EQ(r.exitCode, 0) << r.describe();
    before_ = readFile(ckpt_);
  }
  std::string dir_, ckpt_, before_;
};

TEST_F(ExportCliTest, OntoTheCheckpointItReadsIsRefused) {
  ASSERT_EQ(::link(ckpt_.c_str(), (dir_ + "/alias.st").c_str()), 0);
  for (const std::string& out : {ckpt_, dir_ + "/alias.st"}) {
    CommandResult r = runCohort({"export", "--format", "llmc", ckpt_, out});
    EXPECT_EQ(r.exitCode, 2) << r.describe();
    EXPECT_NE(r.stderrText.find(out + " is the checkpoint being exported (" + ckpt_ +
                                "): the export would replace the training state that --resume loads"),
              std::string::npos)
        << r.describe();
    EXPECT_EQ(readFile(ckpt_), before_) << "the checkpoint was replaced";
  }
}

TEST_F(ExportCliTest, OntoACheckpointARunningJobHoldsIsRefusedNamingTheHolder) {
  const std::string live = dir_ + "/live.st", lock = dir_ + "/.live.st.lock";
  writeFile(live, "the live job's checkpoint");
  // The running job: a process holding the checkpoint's lock (as CheckpointLock holds it).
  int ready[2], release[2];
  ASSERT_EQ(::pipe(ready), 0);
  ASSERT_EQ(::pipe(release), 0);
  const pid_t job = ::fork();
  if (job == 0) {
    ::close(ready[0]);
    ::close(release[1]);
    const int fd = ::open(lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0 || ::flock(fd, LOCK_EX) != 0) ::_exit(1);
    char c = 1;
    if (::write(ready[1], &c, 1) != 1) ::_exit(1);
    (void)!::read(release[0], &c, 1);  // EOF: released
    ::_exit(0);
  }
  ::close(ready[1]);
  ::close(release[0]);
  char c = 0;
  ASSERT_EQ(::read(ready[0], &c, 1), 1) << "the job did not start";
  CommandResult r = runCohort({"export", "--format", "llmc", ckpt_, live});
  ::close(release[1]);
  int status = 0;
  ::waitpid(job, &status, 0);
  EXPECT_EQ(r.exitCode, 2) << r.describe();
  EXPECT_NE(r.stderrText.find(live + " is the checkpoint of a running job (pid " + std::to_string(job) + " on "),
            std::string::npos)
      << r.describe();
  EXPECT_EQ(readFile(live), "the live job's checkpoint");
  // Once the job is gone, the export goes through.
  r = runCohort({"export", "--format", "llmc", ckpt_, live});
  EXPECT_EQ(r.exitCode, 0) << r.describe();
}

}  // namespace
}  // namespace cohort::testing
