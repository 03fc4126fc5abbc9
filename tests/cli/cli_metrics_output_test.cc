// `cohort train --metrics FILE` on a shared machine and a full disk (issue 44, items 6 and 7): only
// a regular file of the user is appended to (a FIFO hung the run, a symbolic link was followed
// anywhere), every write is checked (a full disk cut a line and exited 0), a failed write stops the
// run with exit 2 after its checkpoint, and a torn last line is cut off with a warning. The other
// user's moves run as a second, unprivileged local user (tests/support/other_user.h).
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "tests/cli/cli_test_support.h"
#include "tests/support/other_user.h"

namespace cohort::testing {
namespace {

class MetricsOutputTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = "/tmp/metrics_out_XXXXXX";  // the other user must reach it: not under root's home
    ASSERT_NE(::mkdtemp(dir_.data()), nullptr);
    ASSERT_EQ(::chmod(dir_.c_str(), 01777), 0);  // shared, as /tmp is
    std::ostringstream csv;
    csv << "a,b,c,target\n";
    for (int i = 0; i < 64; ++i) csv << i % 4 << "," << i % 3 << "," << i % 5 << "," << (i % 4) - (i % 3) << "\n";
    writeFile(path("data.csv"), csv.str());
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string path(const std::string& name) const { return dir_ + "/" + name; }
  // A small regression run: 16 steps per epoch, each line of --log-every-steps 1 ~120 bytes.
  std::vector<std::string> train(const std::vector<std::string>& extra) const {
    std::vector<std::string> a = {
        "train",     "--data", "csv:" + path("data.csv"), "--loss", "mse", "--model", "mlp:3,1", "--batch-size", "4",
        "--threads", "1",      "--progress-every",        "0"};
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  }
  std::string dir_;
};

// A FIFO blocked the open after training, forever; a device was written to. Both are refused
// before the first step, as --data refuses them.
TEST_F(MetricsOutputTest, AFifoIsRefusedBeforeTrainingAndNeverWaitedOn) {
  ASSERT_EQ(::mkfifo(path("fifo").c_str(), 0600), 0);
  CommandResult r = runCohort(train({"--metrics", path("fifo")}), {.timeout = std::chrono::seconds(60)});
  EXPECT_FALSE(r.timedOut) << r.describe();
  EXPECT_EQ(r.exitCode, 2) << r.describe();
  EXPECT_NE(r.stderrText.find(path("fifo") + ": is a FIFO or pipe, not a regular file"), std::string::npos)
      << r.describe();
  EXPECT_EQ(r.stdoutText.find("epoch 1/"), std::string::npos) << "nothing was trained\n" << r.describe();
}

// A symbolic link is followed only when it and its file are the user's own.
TEST_F(MetricsOutputTest, SymbolicLinksToOrFromAnotherUserAreRefusedSayingSo) {
  std::string why;
  auto user = otherUser(&why);
  if (!user) GTEST_SKIP() << why;
  const std::string theirs = path("theirs.jsonl"), mine = path("mine.jsonl");
  writeFile(mine, "");
  ASSERT_EQ(runAsOtherUser(*user,
                           [&] {
                             writeFile(theirs, "");
                             if (::chmod(theirs.c_str(), 0666) != 0) return 1;
                             return ::symlink(mine.c_str(), path("planted").c_str()) == 0 ? 0
                                                                                          : 2;  // to the victim's file
                           }),
            0);
  ASSERT_EQ(::symlink(theirs.c_str(), path("to-theirs").c_str()), 0);  // the victim's own link
  ASSERT_EQ(::symlink(mine.c_str(), path("to-mine").c_str()), 0);

  CommandResult r = runCohort(train({"--metrics", path("to-theirs")}));
  EXPECT_EQ(r.exitCode, 2) << r.describe();
  EXPECT_NE(r.stderrText.find(path("to-theirs") + ": is a symbolic link to " + theirs + ", which is owned by "),
            std::string::npos)
      << r.describe();
  EXPECT_NE(r.stderrText.find("uid " + std::to_string(user->uid)), std::string::npos) << r.describe();
  EXPECT_EQ(readFile(theirs), "");

  r = runCohort(train({"--metrics", path("planted")}));
  EXPECT_EQ(r.exitCode, 2) << r.describe();
  EXPECT_NE(r.stderrText.find(path("planted") + ": is a symbolic link owned by "), std::string::npos) << r.describe();
  EXPECT_EQ(readFile(mine), "");

  r = runCohort(train({"--metrics", path("to-mine")}));
  EXPECT_EQ(r.exitCode, 0) << r.describe();
  EXPECT_NE(readFile(mine).find("\"epoch\":1"), std::string::npos) << "one's own link to one's own file is followed";
}

// Item 7: the file can grow no further (RLIMIT_FSIZE, with SIGXFSZ ignored: EFBIG, as ENOSPC on a
// full disk). The run stops with exit 2 naming the file, after the step's checkpoint, and the file
// holds whole lines only; the checkpoint resumes.
TEST_F(MetricsOutputTest, AFailedMetricsWriteStopsTheRunAfterItsCheckpointAndLeavesWholeLines) {
  const std::string metrics = path("m.jsonl"), ckpt = path("c.st");
  // 4 KiB (bash counts 1024-byte blocks); the checkpoint of mlp:3,1 is smaller.
  std::string command = "trap '' XFSZ; ulimit -f 4; exec '" + cohortBinary() + "'";
  for (const std::string& a :
       train({"--epochs", "20", "--log-every-steps", "1", "--metrics", metrics, "--checkpoint", ckpt})) {
    command += " '" + a + "'";
  }
  CommandResult r = runCommand({"/bin/bash", "-c", command});
  EXPECT_EQ(r.exitCode, 2) << r.describe();
  EXPECT_NE(r.stderrText.find(metrics + ": cannot append metrics: File too large (the run stopped at step "),
            std::string::npos)
      << r.describe();
  EXPECT_NE(r.stdoutText.find("stop requested (the metrics file cannot be written): checkpointing at step "),
            std::string::npos)
      << r.describe();
  const std::string text = readFile(metrics);
  ASSERT_FALSE(text.empty());
  EXPECT_EQ(text.back(), '\n') << "a torn last line";
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    EXPECT_TRUE(line.front() == '{' && line.back() == '}') << line;
  }
  ASSERT_TRUE(fileExists(ckpt)) << r.describe();
  r = runCohort(train({"--epochs", "20", "--checkpoint", ckpt, "--resume"}));
  EXPECT_EQ(r.exitCode, 0) << r.describe();
  EXPECT_NE(r.stdoutText.find("resumed from " + ckpt), std::string::npos) << r.describe();
}

// Item 7: a line torn by a killed run is cut off at the next run's start, with a warning naming the
// file and the byte offset; the next lines start on a line of their own.
TEST_F(MetricsOutputTest, ATornLastLineIsCutOffWithAWarning) {
  const std::string metrics = path("m.jsonl");
  const std::string whole = "{\"epoch\":1,\"step\":16,\"train_loss\":0.5,\"run_samples_per_s\":1}\n";
  writeFile(metrics, whole + "{\"epoch\":2,\"st");
  CommandResult r = runCohort(train({"--epochs", "1", "--metrics", metrics}));
  EXPECT_EQ(r.exitCode, 0) << r.describe();
  EXPECT_NE(
      r.stdoutText.find("warning: " + metrics + ": its last line was torn (a run stopped mid-write): cut off at byte " +
                        std::to_string(whole.size())),
      std::string::npos)
      << r.describe();
  const std::string text = readFile(metrics);
  EXPECT_EQ(text.rfind(whole + "{\"epoch\":1,", 0), 0u) << text;
  EXPECT_EQ(text.find("\"st{"), std::string::npos) << text;
}

}  // namespace
}  // namespace cohort::testing
