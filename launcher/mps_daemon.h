// MpsDaemon: a private NVIDIA MPS control daemon for one cohortrun job (`cohortrun --mps`,
// docs/launcher.md, "MPS"). Several processes on one GPU time-slice it unless an MPS daemon lets
// their kernels run side by side (docs/gpu.md, "Hogwild on a GPU").
//
// start() finds `nvidia-cuda-mps-control` on the PATH of options.environment (InvalidArgument when
// it is not there), makes the job's directory <jobDirectory>-XXXXXX with mkdtemp (mode 0700, a name
// no other user can guess and make first: issue 44; directory() below), and in it mps-pipe and
// mps-log (mode 0700), runs
// `nvidia-cuda-mps-control -d` with CUDA_MPS_PIPE_DIRECTORY and CUDA_MPS_LOG_DIRECTORY pointing at
// them, and waits, up to options.timeout, until the daemon's control socket mps-pipe/control exists.
// A daemon that fails (`-d` exits non-zero) or does not come up in time is InvalidArgument (exit
// code 2: the environment cannot run MPS), naming the problem and the last line it wrote.
// environment() gives both variables for the workers: CUDA contexts made with them use this daemon.
//
// stop() runs `echo quit | nvidia-cuda-mps-control` with the same variables (when the control
// socket exists), waits up to options.timeout for the daemon process named in
// mps-pipe/nvidia-cuda-mps-control.pid to exit (SIGKILL after that), and removes directory()
// whole. It returns warnings (a quit that timed out, a daemon that had to be killed) for the
// caller to print. Every helper run has options.timeout; the helpers' stdout and stderr go to
// directory()/mps-control.out (created O_EXCL, never opened through a symlink), so that an error
// can quote them.
//
// Ownership: owns directory() and the daemon; the destructor calls stop() when the owner has not
// (dropping its warnings), so the daemon is stopped however the job ends (a worker failure or a signal ends the poll
// loop normally; an exception unwinds). A SIGKILLed cohortrun leaves its daemon and directory behind. Thread safety:
// none; main thread only (it forks).
//
//   auto mps = MpsDaemon::start({.jobDirectory = plan.jobDirectory, .environment = plan.baseEnvironment});
//   env.insert(env.end(), mps->environment().begin(), mps->environment().end());
//   for (const std::string& w : mps->stop()) say("warning: " + w);
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

namespace cohort::launcher {

struct MpsDaemonOptions {
  std::string jobDirectory;              // the directory's prefix: <jobDirectory>-XXXXXX is made
  std::vector<std::string> environment;  // "NAME=value": the helpers' environment (PATH is searched)
  std::string program = "nvidia-cuda-mps-control";
  std::chrono::milliseconds timeout{10000};  // for each wait: coming up, quitting, exiting
};

class MpsDaemon {
 public:
  static std::unique_ptr<MpsDaemon> start(const MpsDaemonOptions& options);
  MpsDaemon(const MpsDaemon&) = delete;
  MpsDaemon& operator=(const MpsDaemon&) = delete;
  ~MpsDaemon();

  // {"CUDA_MPS_PIPE_DIRECTORY=<directory()>/mps-pipe", "CUDA_MPS_LOG_DIRECTORY=<directory()>/mps-log"}
  const std::vector<std::string>& environment() const { return variables_; }
  // The job's directory that start() made: <jobDirectory>-XXXXXX; removed by stop().
  const std::string& directory() const { return directory_; }
  const std::string& pipeDirectory() const { return pipeDirectory_; }

  // Idempotent; see the top of this file.
  std::vector<std::string> stop();

 private:
  MpsDaemon(const MpsDaemonOptions& options, std::string programPath, std::string directory);
  void awaitControl();
  void runQuit(std::vector<std::string>& warnings);
  void awaitDaemonExit(std::vector<std::string>& warnings);

  MpsDaemonOptions options_;
  std::string programPath_;
  std::string directory_;
  std::string pipeDirectory_;
  std::string logDirectory_;
  std::vector<std::string> variables_;
  bool stopped_ = false;
};

// The names of the two variables environment() sets; an inherited value must not reach a worker.
bool isMpsVariable(const std::string& entry);

}  // namespace cohort::launcher
