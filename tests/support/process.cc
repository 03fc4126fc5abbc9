#include "tests/support/process.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <sstream>

extern char** environ;

namespace cohort::testing {

// COHORT_TEST_TIMEOUT_SCALE=K (a whole number >= 1) multiplies every timeout: a test run under a
// tool that slows the program down (compute-sanitizer, scripts/gpu_run.sh) gives its children time.
static int timeoutScale() {
  const char* v = std::getenv("COHORT_TEST_TIMEOUT_SCALE");
  const int k = v ? std::atoi(v) : 1;
  return k >= 1 ? k : 1;
}
namespace {

using Clock = std::chrono::steady_clock;

// Variables that WorldInfo::detect() reads; a test run inside a launcher or a batch job must not
// turn the child into one rank of that job. (COHORT_SHM_DIR and the like pass: tests set them.)
bool isJobVariable(const char* entry) {
  static const char* const kPrefixes[] = {"RANK=",          "LOCAL_RANK=",          "WORLD_SIZE=",
                                          "LOCAL_WORLD_SIZE=", "COHORT_JOB_ID=",     "COHORT_RESTART_COUNT=",
                                          "OMPI_COMM_WORLD_", "SLURM_",              "PMI_"};
  for (const char* prefix : kPrefixes) {
    if (std::strncmp(entry, prefix, std::strlen(prefix)) == 0) return true;
  }
  return false;
}

// "TMPDIR=$TEST_TMPDIR" for a child, or empty when the test sets TMPDIR itself or runs outside Bazel.
std::string privateTmpdir(const std::vector<std::string>& extraEnvironment) {
  for (const std::string& extra : extraEnvironment) {
    if (extra.rfind("TMPDIR=", 0) == 0) return {};
  }
  const char* base = std::getenv("TEST_TMPDIR");
  return base && *base ? std::string("TMPDIR=") + base : std::string();
}

// Appends what is readable on `fd` to `out`; returns false at end of file.
bool drain(int fd, std::string& out) {
  char buf[65536];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n > 0) {
      out.append(buf, static_cast<size_t>(n));
      return true;
    }
    if (n == 0) return false;
    if (errno == EINTR) continue;
    return errno == EAGAIN;  // any other error: treat as closed
  }
}

void closeFd(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

}  // namespace

std::string CommandResult::describe() const {
  std::ostringstream os;
  os << "command: " << commandLine << "\n";
  if (timedOut) os << "TIMED OUT (killed)\n";
  if (signal != 0) os << "killed by signal " << signal << "\n";
  os << "exit code: " << exitCode << "\n--- stdout ---\n"
     << stdoutText << "--- stderr ---\n"
     << stderrText << "--------------";
  return os.str();
}

CommandResult runCommand(const std::vector<std::string>& argv, const CommandOptions& options) {
  CommandResult result;
  for (const std::string& a : argv) result.commandLine += (result.commandLine.empty() ? "" : " ") + a;
  if (argv.empty()) {
    ADD_FAILURE() << "runCommand: empty argv";
    return result;
  }
  // Everything the child needs is prepared before fork: after it, the child only calls
  // async-signal-safe functions.
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  // TMPDIR is the test's own directory unless the test sets one (Bazel gives every test TMPDIR=/tmp),
  // and so is the directory of Open MPI's shared-memory transport (vader: /dev/shm by default).
  // Open MPI keeps mpirun's session directory there, <TMPDIR>/ompi.<host>.<uid>/pid.<mpirun's pid>:
  // concurrent tests' mpiruns race to create the first level, and in Bazel's sandboxes (a pid
  // namespace each) two mpiruns can have the same pid, so one job's ranks reach the other's server
  // ("getting local rank failed", examples_test 1 run in 20 with the cores loaded). Apart, their
  // ranks still named their vader segments /dev/shm/vader_segment.<host>.<job id from the pid>.<rank>
  // alike and mapped each other's (a SIGSEGV in mca_btl_vader_poll_handle_frag, 8 runs in 40).
  const std::string ownTmp = privateTmpdir(options.extraEnvironment);
  std::vector<char*> env;
  for (char** e = environ; *e; ++e) {
    if (!isJobVariable(*e) && (ownTmp.empty() || std::strncmp(*e, "TMPDIR=", 7) != 0)) env.push_back(*e);
  }
  const std::string ownVader = ownTmp.empty() ? std::string() : "OMPI_MCA_btl_vader_backing_directory=" + ownTmp.substr(7);
  if (!ownTmp.empty()) {
    env.push_back(const_cast<char*>(ownTmp.c_str()));
    env.push_back(const_cast<char*>(ownVader.c_str()));
  }
  for (const std::string& extra : options.extraEnvironment) env.push_back(const_cast<char*>(extra.c_str()));
  env.push_back(nullptr);
  const char* cwd = options.workingDirectory.empty() ? nullptr : options.workingDirectory.c_str();

  int outPipe[2], errPipe[2];
  if (::pipe2(outPipe, O_CLOEXEC) != 0 || ::pipe2(errPipe, O_CLOEXEC) != 0) {
    ADD_FAILURE() << "pipe2: " << std::strerror(errno);
    return result;
  }
  int devNull = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  const pid_t pid = ::fork();
  if (pid < 0) {
    ADD_FAILURE() << "fork: " << std::strerror(errno);
    return result;
  }
  if (pid == 0) {
    ::dup2(devNull, 0);
    ::dup2(outPipe[1], 1);
    ::dup2(errPipe[1], 2);
    if (cwd && ::chdir(cwd) != 0) {
      const char msg[] = "runCommand: chdir failed\n";
      (void)!::write(2, msg, sizeof msg - 1);
      ::_exit(127);
    }
    ::execve(args[0], args.data(), env.data());
    const char msg[] = "runCommand: execve failed: ";
    (void)!::write(2, msg, sizeof msg - 1);
    (void)!::write(2, args[0], std::strlen(args[0]));
    (void)!::write(2, "\n", 1);
    ::_exit(127);
  }
  ::close(devNull);
  ::close(outPipe[1]);
  ::close(errPipe[1]);
  int outFd = outPipe[0], errFd = errPipe[0];
  ::fcntl(outFd, F_SETFL, O_NONBLOCK);
  ::fcntl(errFd, F_SETFL, O_NONBLOCK);

  // A pidfd becomes readable when the child exits, so the wait for the exit is bounded by the same
  // deadline as the reads. Without pidfds (Linux < 5.3) the final waitpid blocks once the pipes close.
  int exitFd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  const auto deadline = Clock::now() + options.timeout * timeoutScale();
  while (outFd >= 0 || errFd >= 0 || exitFd >= 0) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) {
      result.timedOut = true;
      ::kill(pid, SIGKILL);
      break;
    }
    pollfd fds[3] = {{outFd, POLLIN, 0}, {errFd, POLLIN, 0}, {exitFd, POLLIN, 0}};  // negative fds: ignored
    int ready = ::poll(fds, 3, static_cast<int>(std::min<long long>(left, 1000)));
    if (ready < 0 && errno != EINTR) {
      ADD_FAILURE() << "poll: " << std::strerror(errno);
      result.timedOut = true;
      ::kill(pid, SIGKILL);
      break;
    }
    if (ready <= 0) continue;
    if (fds[0].revents && !drain(outFd, result.stdoutText)) closeFd(outFd);
    if (fds[1].revents && !drain(errFd, result.stderrText)) closeFd(errFd);
    if (fds[2].revents) closeFd(exitFd);
  }
  closeFd(outFd);
  closeFd(errFd);
  closeFd(exitFd);

  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(status)) result.exitCode = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) result.signal = WTERMSIG(status);
  if (result.timedOut) {
    ADD_FAILURE() << "timed out after " << options.timeout.count() * timeoutScale() << " s and killed: " << result.commandLine;
  }
  return result;
}

}  // namespace cohort::testing

namespace cohort::testing {

std::string runfile(const std::string& workspacePath) {
  std::vector<std::string> candidates;
  if (const char* srcdir = std::getenv("TEST_SRCDIR")) candidates.push_back(std::string(srcdir) + "/cohort/" + workspacePath);
  char cwd[4096];
  if (::getcwd(cwd, sizeof cwd)) candidates.push_back(std::string(cwd) + "/" + workspacePath);
  for (const std::string& path : candidates) {
    if (::access(path.c_str(), X_OK) == 0 || ::access(path.c_str(), R_OK) == 0) return path;
  }
  ADD_FAILURE() << workspacePath << " not found in the runfiles (tried $TEST_SRCDIR/cohort/ and ./)";
  return workspacePath;
}

std::string freshTempDir() {
  const char* base = std::getenv("TEST_TMPDIR");
  std::string name = "test";
  if (const auto* info = ::testing::UnitTest::GetInstance()->current_test_info()) {
    name = std::string(info->test_suite_name()) + "." + info->name();
    std::replace(name.begin(), name.end(), '/', '_');
  }
  std::string pattern = std::string(base ? base : "/tmp") + "/" + name + ".XXXXXX";
  if (!::mkdtemp(pattern.data())) ADD_FAILURE() << "mkdtemp " << pattern << ": " << std::strerror(errno);
  return pattern;
}

std::vector<std::string> linesWith(const std::string& text, const std::string& needle) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.find(needle) != std::string::npos) lines.push_back(line);
  }
  return lines;
}

}  // namespace cohort::testing
