// SIGTERM and SIGHUP to a worker started directly (issue 33, item 17): they used to kill it without a
// word or a checkpoint, while docs/launcher.md says SIGTERM lets workers checkpoint and leave. Now
// the first one stops the loop after its step with a checkpoint (exit 128 + the signal, the RESULT
// line's stopped=signal) and the same command with --resume continues; a second one ends the worker
// at once, even during set-up. And a second run given the same --checkpoint as a running one is
// refused at once, naming the first (item 19; it used to run beside it, the last writer winning).
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>

#include "tests/cli/cli_test_support.h"

namespace cohort::testing {
namespace {

class SignalsCliTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = freshTempDir(); }

  std::vector<std::string> train(const std::string& checkpoint) const {
    return {cohortBinary(), "train", "--threads", "1", "--model", "mlp:784,64,10", "--epochs", "3", "--batch-size", "64",
            "--progress-every", "0", "--checkpoint", checkpoint, "--checkpoint-every", "50", "--resume"};
  }

  // Runs `argv` in the background, sends `signals` (e.g. "TERM") once the first periodic checkpoint
  // exists, and waits for it.
  CommandResult signalled(const std::vector<std::string>& argv, const std::string& checkpoint, const std::string& signal) {
    std::string quoted;
    for (const auto& a : argv) quoted += " '" + a + "'";
    const std::string script = quoted + " & pid=$!; n=0; until [ -f '" + checkpoint +
                               "' ] || [ $n -ge 1200 ]; do sleep 0.05; n=$((n+1)); done; kill -" + signal +
                               " $pid; wait $pid";
    return runCommand({"/bin/sh", "-c", script}, {.timeout = std::chrono::seconds(240)});
  }

  std::string dir_;
};

TEST_F(SignalsCliTest, SigtermAndSighupCheckpointAndLeaveAndTheRunResumes) {
  for (const auto& [signal, code] : {std::pair<std::string, int>{"TERM", 143}, {"HUP", 129}}) {
    const std::string ckpt = dir_ + "/" + signal + ".st";
    CommandResult r = signalled(train(ckpt), ckpt, signal);
    EXPECT_EQ(r.exitCode, code) << r.describe();
    EXPECT_NE(r.stderrText.find("cohort: SIG" + signal + ": stopping after this step"), std::string::npos) << r.describe();
    EXPECT_NE(r.stdoutText.find("stop requested (SIG" + signal + "): checkpointing at step"), std::string::npos) << r.describe();
    ResultLine stopped = parseResultLine(r.stdoutText);
    ASSERT_EQ(stopped.count, 1) << r.describe();
    EXPECT_EQ(stopped.fields["stopped"], "signal") << r.describe();
    CommandResult resumed = runCommand(train(ckpt), {.timeout = std::chrono::seconds(240)});
    ASSERT_EQ(resumed.exitCode, 0) << resumed.describe();
    EXPECT_NE(resumed.stdoutText.find("resumed from " + ckpt), std::string::npos) << resumed.describe();
    EXPECT_EQ(parseResultLine(resumed.stdoutText).number("epochs"), 3) << resumed.describe();
  }
}

TEST_F(SignalsCliTest, ASecondSigtermEndsTheWorkerAtOnce) {
  std::string quoted;
  for (const auto& a : train(dir_ + "/twice.st")) quoted += " '" + a + "'";
  // Both during set-up, before the loop could see the first.
  const std::string script = quoted + " & pid=$!; sleep 0.2; kill -TERM $pid; sleep 0.2; kill -TERM $pid; wait $pid";
  const auto start = std::chrono::steady_clock::now();
  CommandResult r = runCommand({"/bin/sh", "-c", script}, {.timeout = std::chrono::seconds(60)});
  EXPECT_EQ(r.exitCode, 143) << r.describe();
  EXPECT_NE(r.stderrText.find("cohort: SIGTERM again: leaving now, without a checkpoint"), std::string::npos) << r.describe();
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 20.0) << r.describe();
}

TEST_F(SignalsCliTest, ASecondRunOnTheSameCheckpointIsRefusedNamingTheFirst) {
  const std::string ckpt = dir_ + "/shared.st", lock = dir_ + "/.shared.st.lock";
  std::string quoted;
  for (const auto& a : train(ckpt)) quoted += " '" + a + "'";
  std::string second;
  for (const auto& a : train(ckpt)) second += " '" + a + "'";
  // The second starts once the first holds the lock and has checkpointed; then the first is stopped.
  const std::string script = quoted + " & pid=$!; n=0; until [ -f '" + ckpt + "' ] || [ $n -ge 1200 ]; do sleep 0.05; " +
                             "n=$((n+1)); done;" + second + "; echo \"second exited $?\"; kill -TERM $pid; wait $pid";
  CommandResult r = runCommand({"/bin/sh", "-c", script}, {.timeout = std::chrono::seconds(240)});
  EXPECT_EQ(r.exitCode, 143) << r.describe();
  EXPECT_NE(r.stdoutText.find("second exited 2"), std::string::npos) << r.describe();
  EXPECT_NE(r.stderrText.find(ckpt + ": another run is writing its checkpoints here (pid "), std::string::npos) << r.describe();
  EXPECT_FALSE(fileExists(lock)) << "the first run removes its lock file";
  EXPECT_EQ(parseResultLine(r.stdoutText).count, 1) << "only the first trained\n" << r.describe();
}

}  // namespace
}  // namespace cohort::testing
