#include "tests/collectives/mpi_run.h"

#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>

extern char** environ;

namespace cohort::collectives::testing {

namespace {

bool inheritable(const std::string& entry) {
  for (const char* prefix :
       {"OMPI_", "PMIX_", "PMI_", "SLURM_", "RANK=", "WORLD_SIZE=", "LOCAL_RANK=", "LOCAL_WORLD_SIZE=", "COHORT_", "TMPDIR="}) {
    if (entry.rfind(prefix, 0) == 0) return false;
  }
  return true;
}

}  // namespace

namespace {
constexpr std::chrono::seconds kOutlivedGrace{5};
}  // namespace

MpirunResult runMpirun(const MpirunOptions& options) {
  std::vector<std::string> args = {"/usr/bin/mpirun", "--oversubscribe", "-np", std::to_string(options.ranks)};
  args.insert(args.end(), options.argv.begin(), options.argv.end());
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    if (inheritable(*e)) env.push_back(*e);
  }
  env.push_back("OMPI_ALLOW_RUN_AS_ROOT=1");
  env.push_back("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1");
  // Open MPI's shared-memory transport and session directory need a writable TMPDIR, and one of the
  // test's own: Open MPI 4.1 names the session directory after the host and user only
  // (<TMPDIR>/ompi.<host>.<uid>), and concurrent mpiruns creating it in a shared /tmp race ("A call
  // to mkdir was unable to create the desired directory ... File exists", 1 run in 20 loaded). The
  // inherited TMPDIR is dropped above: getenv() would find it before this one.
  const char* tmp = std::getenv("TEST_TMPDIR");
  env.push_back(std::string("TMPDIR=") + (tmp && *tmp ? tmp : "/tmp"));
  // Its shared-memory transport's segments too (vader: /dev/shm by default, named after a job id
  // that two sandboxed tests' mpiruns with the same pid share: tests/support/process.cc).
  if (tmp && *tmp) env.push_back(std::string("OMPI_MCA_btl_vader_backing_directory=") + tmp);
  std::vector<char*> argvPtrs, envPtrs;
  for (auto& a : args) argvPtrs.push_back(a.data());
  argvPtrs.push_back(nullptr);
  for (auto& e : env) envPtrs.push_back(e.data());
  envPtrs.push_back(nullptr);

  MpirunResult result;
  int pipeFds[2];
  if (pipe2(pipeFds, O_CLOEXEC) != 0) {
    result.output = std::string("pipe: ") + std::strerror(errno);
    return result;
  }
  const auto start = std::chrono::steady_clock::now();
  const pid_t child = fork();
  if (child == 0) {
    setpgid(0, 0);
    dup2(pipeFds[1], 1);
    dup2(pipeFds[1], 2);
    int devNull = open("/dev/null", O_RDONLY);
    dup2(devNull, 0);
    execve(argvPtrs[0], argvPtrs.data(), envPtrs.data());
    std::fprintf(stderr, "exec %s: %s\n", argvPtrs[0], std::strerror(errno));
    _exit(127);
  }
  setpgid(child, child);  // also here, so killpg works however the race goes
  close(pipeFds[1]);
  const auto deadline = start + options.timeout;
  char buffer[65536];
  int status = 0;
  bool reaped = false;
  std::chrono::steady_clock::time_point exitedAt;
  for (;;) {
    const auto now = std::chrono::steady_clock::now();
    // mpirun gone but the pipe still open: a process of the job outlived it (a rank that mpirun's
    // abort did not reach). It is killed after a grace, and the result says so.
    if (!reaped && waitpid(child, &status, WNOHANG) == child) {
      reaped = true;
      exitedAt = now;
    }
    if (reaped && now - exitedAt > kOutlivedGrace) {
      result.outlived = true;
      result.output += "\n[runMpirun: processes of the job still held its output " +
                       std::to_string(kOutlivedGrace.count()) + " s after mpirun exited; killed]\n";
      break;
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now);
    if (left.count() <= 0) {
      result.timedOut = true;
      break;
    }
    pollfd pfd{pipeFds[0], POLLIN, 0};
    const int ready = poll(&pfd, 1, static_cast<int>(std::min<long>(left.count(), 1000)));
    if (ready <= 0) continue;
    const ssize_t n = read(pipeFds[0], buffer, sizeof buffer);
    if (n <= 0) break;  // every writer (mpirun and all ranks) closed the pipe
    result.output.append(buffer, n);
  }
  if (result.timedOut || result.outlived) killpg(child, SIGKILL);
  // The pipe closes when the job's processes exit; mpirun itself is reaped here, bounded too.
  while (!reaped) {
    if (waitpid(child, &status, WNOHANG) == child) break;
    if (std::chrono::steady_clock::now() > deadline + std::chrono::seconds(5)) {
      killpg(child, SIGKILL);
      result.timedOut = true;
    }
    usleep(10000);
  }
  killpg(child, SIGKILL);  // stragglers of the group, if any
  close(pipeFds[0]);
  result.exitCode = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

}  // namespace cohort::collectives::testing
