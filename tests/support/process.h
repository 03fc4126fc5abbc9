// runCommand: runs a program as a child process (fork + exec) and collects what it printed.
//
// The child gets the argv given (argv[0] is the program path, exec'd without a PATH search), the
// parent's environment minus the variables that make a Cohort worker believe it is one rank of a
// job (RANK, WORLD_SIZE, OMPI_COMM_WORLD_*, SLURM_*, PMI_*, COHORT_*: see runtime/world_info.h), and
// /dev/null as stdin. stdout and stderr are captured separately through two pipes that are drained
// together, so a child that writes a lot to either never blocks. A child still running at the
// deadline is killed with SIGKILL and reported as timed out; runCommand never waits longer than
// the timeout plus the time to reap the child.
// Thread safety: each call owns its child and pipes; calls from several threads are fine except
// that a child may inherit the other threads' pipe ends for a moment (harmless for the tests here,
// which run one command at a time).
//
//   CommandResult r = runCommand({cohortBinary(), "train", "--epochs", "0"});
//   EXPECT_EQ(r.exitCode, 2) << r.describe();
#pragma once

#include <chrono>
#include <string>
#include <vector>

namespace cohort::testing {

struct CommandOptions {
  std::chrono::seconds timeout{120};  // times COHORT_TEST_TIMEOUT_SCALE when set (process.cc)
  std::string workingDirectory;  // empty: the caller's
  std::vector<std::string> extraEnvironment;  // "NAME=value" added to the child's environment
};

struct CommandResult {
  int exitCode = -1;  // the child's exit status; -1 when it was killed by a signal
  int signal = 0;     // the signal that ended the child, or 0
  bool timedOut = false;
  std::string stdoutText;
  std::string stderrText;
  std::string commandLine;  // the argv joined by spaces, for messages

  // The command line, exit status and both outputs, for test failure messages.
  std::string describe() const;
};

// Fails the calling test (ADD_FAILURE) and returns a result with exitCode -1 if the fork or pipes
// cannot be set up, or if exec fails (the child then exits with 127 and says why on stderr).
CommandResult runCommand(const std::vector<std::string>& argv, const CommandOptions& options = {});

}  // namespace cohort::testing

namespace cohort::testing {

// The absolute path of a workspace file in this test's runfiles ("cli/cohort"); fails the test when
// it is missing.
std::string runfile(const std::string& workspacePath);

// A new, empty directory under $TEST_TMPDIR named after the running test.
std::string freshTempDir();

// The lines of `text` that contain `needle`.
std::vector<std::string> linesWith(const std::string& text, const std::string& needle);

}  // namespace cohort::testing
