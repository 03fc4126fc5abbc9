// WorkerProcess: one worker started by fork+exec, owned until it has been reaped.
//
// spawn() puts the child in a process group of its own (so a terminal's Ctrl-C reaches only
// cohortrun, which forwards it), makes the kernel SIGKILL it the moment the launcher dies
// (PR_SET_PDEATHSIG, then a getppid() check for a launcher that died before that call), gives it
// /dev/null as stdin and one pipe each for stdout and stderr, an empty signal mask and the default
// action for SIGHUP, SIGINT, SIGTERM, SIGUSR1 and SIGPIPE, and execs PROGRAM with execvpe (a PATH
// search unless PROGRAM contains a '/'). It returns only once exec has succeeded: an exec failure is
// reported by the child through a close-on-exec pipe and thrown as InvalidArgument
// ("cannot execute 'foo': No such file or directory"). Fork only from the main thread: the death
// signal follows the forking thread, not the process.
// Ownership: a WorkerProcess owns the child and its two pipe read ends. The destructor SIGKILLs a
// child that has not been reaped (with its whole process group) and reaps it, so no zombie or orphan
// outlives its owner. Move is not supported: hold it in a std::unique_ptr.
// Thread safety: none.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "runtime/unique_fd.h"

namespace cohort::launcher {

struct ExitStatus {
  int code = 0;    // the exit code when signal == 0
  int signal = 0;  // the signal that terminated the process, or 0

  bool ok() const { return signal == 0 && code == 0; }
  // What cohortrun exits with for this status: the code, or 128 + signal (137 for SIGKILL).
  int launcherExitCode() const { return signal != 0 ? 128 + signal : code; }
  // "exited with code 3" or "terminated by signal 9 (SIGKILL)".
  std::string describe() const;
};

// argv or envp for exec: pointers into `strings` (which must outlive them), then nullptr.
std::vector<char*> toCStrings(const std::vector<std::string>& strings);

struct SpawnOptions {
  int rank = 0;
  std::vector<std::string> argv;                 // argv[0] is PROGRAM
  std::vector<std::string> environment;          // "NAME=value": the child's whole environment
  std::vector<int> cpus;                         // bind the child to these CPUs; empty: not bound
  std::chrono::milliseconds execTimeout{10000};  // fork-to-exec; only a wedged system takes long
};

class WorkerProcess {
 public:
  // Throws InvalidArgument when PROGRAM cannot be executed, cohort::Error when pipes or fork fail or
  // exec does not happen within execTimeout.
  static std::unique_ptr<WorkerProcess> spawn(const SpawnOptions& options);
  WorkerProcess(const WorkerProcess&) = delete;
  WorkerProcess& operator=(const WorkerProcess&) = delete;
  ~WorkerProcess();

  int rank() const { return rank_; }
  pid_t pid() const { return pid_; }
  bool reaped() const { return status_.has_value(); }
  const std::optional<ExitStatus>& status() const { return status_; }

  // Sends `signal` to the worker's process group (the worker and whatever it started there).
  // Does nothing once the worker has been reaped.
  void signal(int signal);

  // Non-blocking. When the worker has exited: SIGKILLs what is left of its process group, reaps the
  // worker, records its status and returns true. Returns false while it runs (or once reaped).
  bool tryReap();

  // The read ends of its stdout and stderr (non-blocking, close-on-exec); the owner resets them at
  // end of file.
  runtime::UniqueFd& stdoutPipe() { return stdout_; }
  runtime::UniqueFd& stderrPipe() { return stderr_; }

 private:
  WorkerProcess(int rank, pid_t pid, runtime::UniqueFd stdoutPipe, runtime::UniqueFd stderrPipe);
  void reapBlocking();

  int rank_;
  pid_t pid_;
  runtime::UniqueFd stdout_;
  runtime::UniqueFd stderr_;
  std::optional<ExitStatus> status_;
};

}  // namespace cohort::launcher
