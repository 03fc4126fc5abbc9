// Helpers for the cohortrun tests: the two binaries from the runfiles, a fresh temporary directory,
// a child process (cohortrun) whose output is collected with a timeout, and checks that processes
// and shared-memory segments are gone.
//
// Child is RAII: a child still running when its owner goes out of scope is SIGKILLed and reaped.
// Every wait has a timeout; a timeout fails the calling test (ADD_FAILURE) instead of hanging.
// Thread safety: none; one test thread.
//
//   Child run = Child::start({cohortrun(), "--nproc-per-node", "2", "--", testWorker(), "--hang"}, env);
//   run.readUntil([](const Output& o) { return countLines(o.out, "pid ") == 2; }, 10s);
//   ::kill(run.pid(), SIGTERM);
//   Output result = run.finish(20s);
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "tests/support/process.h"

namespace cohort::launcher::testing {

// Absolute paths of //launcher:cohortrun and //tests/launcher:test_worker in the runfiles.
std::string cohortrun();
std::string testWorker();

// A new empty directory under $TEST_TMPDIR named after the running test; the lines of a text that
// contain a needle (shared with the other test packages).
using cohort::testing::freshTempDir;
using cohort::testing::linesWith;

struct Output {
  std::string out;
  std::string err;
  int exitCode = -1;  // -1 while running or when ended by a signal
  int signal = 0;
  std::string describe() const;
};

// How Child::start sets up the child before exec, beyond its environment.
struct StartOptions {
  // A process group of its own, as a shell gives each job: one whose parent is in another group of
  // the session, so the kernel does not discard a SIGTSTP to it (as it does for an orphaned group).
  bool ownProcessGroup = false;
  // RLIMIT_NOFILE (soft, hard) as `ulimit -n` / prlimit set it; 0: inherited.
  unsigned long openFilesSoft = 0;
  unsigned long openFilesHard = 0;
};

class Child {
 public:
  // Starts argv[0] (a path) with this process's environment minus job variables (RANK, COHORT_*,
  // OMP_NUM_THREADS, …) plus `extraEnv` ("NAME=value", replacing an inherited NAME), /dev/null as
  // stdin, stdout/stderr piped.
  static Child start(const std::vector<std::string>& argv, const std::vector<std::string>& extraEnv,
                     const StartOptions& options = {});
  Child(Child&& other) noexcept;
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;
  ~Child();

  pid_t pid() const { return pid_; }
  const Output& output() const { return output_; }
  // Collects output until `done(output)` holds (true) or the timeout (false, and a test failure).
  bool readUntil(const std::function<bool(const Output&)>& done, std::chrono::milliseconds timeout);
  // Collects output until the child exits and both pipes close, then reaps it. At the timeout the
  // child is SIGKILLed and the test fails.
  const Output& finish(std::chrono::milliseconds timeout);

 private:
  Child() = default;
  bool pumpOnce(int timeoutMs);  // false once nothing more can come (pipes closed)
  void closeFds();

  pid_t pid_ = -1;
  int outFd_ = -1;
  int errFd_ = -1;
  bool reaped_ = false;
  Output output_;
};

// cohortrun with `args`, run to the end (timeout 60 s).
Output runLauncher(const std::vector<std::string>& args, const std::vector<std::string>& extraEnv);

struct TerminalOptions {
  std::vector<std::string> extraEnv;  // "NAME=value"; TERM is xterm unless given here
  std::chrono::milliseconds timeout{60000};
  int columns = 200;
};
// Runs argv[0] (a path) in a new pseudo-terminal, its controlling terminal and stdin, stdout and
// stderr, `columns` wide, with the environment of Child::start minus TERM. Output post-processing
// is off (no "\n" -> "\r\n") so that every "\r" in Output::out (both streams, in the order the
// terminal got them; err stays empty) was written by a program. Runs to the end: collects until the
// terminal's last writer is gone, then reaps the child; at the timeout the child is SIGKILLed and
// the test fails.
Output runInTerminal(const std::vector<std::string>& argv, const TerminalOptions& options);

// The pids that workers printed ("[rank k] pid P" lines).
std::vector<pid_t> workerPids(const std::string& launcherStdout);
// The pid that rank `rank` printed, or -1 when it has not.
pid_t pidOfRank(const std::string& launcherStdout, int rank);
// The value of "env NAME=value" printed by rank `rank`, or "" when absent.
std::string printedEnv(const std::string& launcherStdout, int rank, const std::string& name);

// True when no process `pid` exists any more (a zombie of another parent counts as gone; a zombie
// child of this process is reaped).
bool processGone(pid_t pid);
// Polls processGone() every 10 ms up to `timeout`.
bool waitUntilGone(pid_t pid, std::chrono::milliseconds timeout);
// Polls every 10 ms, up to `timeout`, until `pid` is stopped (state T in /proc/PID/stat), e.g.
// after a SIGSTOP, whose delivery kill() does not wait for.
bool waitUntilStopped(pid_t pid, std::chrono::milliseconds timeout);

// The names of the files that start with "cohort.<jobId>." in `dir`'s private directory for this
// user (`dir`/cohort-<euid>, ipc/private_dir.h), where a job's segments live.
std::vector<std::string> segmentFiles(const std::string& dir, const std::string& jobId);

}  // namespace cohort::launcher::testing
