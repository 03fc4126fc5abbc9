// The child-process helper the end-to-end tests rely on: separate stdout and stderr, the exit
// status, a working directory, no deadlock on large output, and a kill at the deadline.
#include "tests/support/process.h"

#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include <chrono>

namespace cohort::testing {
namespace {

TEST(RunCommandTest, SeparatesOutputsAndReportsExitCode) {
  CommandResult r = runCommand({"/bin/sh", "-c", "echo out; echo err >&2; echo more; exit 3"});
  EXPECT_EQ(r.exitCode, 3);
  EXPECT_EQ(r.stdoutText, "out\nmore\n");
  EXPECT_EQ(r.stderrText, "err\n");
  EXPECT_FALSE(r.timedOut);
}

TEST(RunCommandTest, RunsInTheWorkingDirectoryWithoutJobVariables) {
  CommandOptions options;
  options.workingDirectory = "/";
  ::setenv("RANK", "3", 1);
  CommandResult r = runCommand({"/bin/sh", "-c", "pwd; echo \"rank=${RANK:-none}\""}, options);
  ::unsetenv("RANK");
  EXPECT_EQ(r.exitCode, 0);
  EXPECT_EQ(r.stdoutText, "/\nrank=none\n");
}

// Both pipes are drained together: a child that fills one while the other is idle never blocks.
TEST(RunCommandTest, LargeOutputOnBothStreams) {
  CommandResult r =
      runCommand({"/bin/sh", "-c", "head -c 1000000 /dev/zero >&2; head -c 700000 /dev/zero; head -c 5 /dev/zero >&2"});
  EXPECT_EQ(r.exitCode, 0);
  EXPECT_EQ(r.stdoutText.size(), 700000u);
  EXPECT_EQ(r.stderrText.size(), 1000005u);
}

TEST(RunCommandTest, ExecFailureIsExit127) {
  CommandResult r = runCommand({"/nonexistent/program"});
  EXPECT_EQ(r.exitCode, 127);
  EXPECT_NE(r.stderrText.find("/nonexistent/program"), std::string::npos);
}

CommandResult hangingResult;

// A child that never ends is killed at the deadline and the test is failed (not hung).
TEST(RunCommandTest, KillsAtTheDeadline) {
  const auto start = std::chrono::steady_clock::now();
  EXPECT_NONFATAL_FAILURE(
      {
        CommandOptions options;
        options.timeout = std::chrono::seconds(1);
        hangingResult = runCommand({"/bin/sh", "-c", "exec sleep 60"}, options);
      },
      "timed out");
  EXPECT_TRUE(hangingResult.timedOut);
  EXPECT_EQ(hangingResult.signal, 9);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30));
}

}  // namespace
}  // namespace cohort::testing
