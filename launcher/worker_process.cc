#include "launcher/worker_process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sched.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "launcher/signal_channel.h"
#include "runtime/error.h"

namespace cohort::launcher {
namespace {

struct Pipe {
  runtime::UniqueFd read;
  runtime::UniqueFd write;
};

Pipe makePipe() {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) COHORT_THROW(Error) << "pipe2: " << std::strerror(errno);
  return Pipe{runtime::UniqueFd(fds[0]), runtime::UniqueFd(fds[1])};
}

// Everything a child needs, prepared before fork, so that after fork only async-signal-safe calls
// are made.
struct ChildSetup {
  pid_t launcherPid;
  int stdinFd;
  int stdoutFd;
  int stderrFd;
  int execErrorFd;
  char** argv;
  char** envp;
  const cpu_set_t* cpus;  // nullptr: not bound
};

[[noreturn]] void runChild(const ChildSetup& s) {
  ::setpgid(0, 0);
  // Die with the launcher, even when it is SIGKILLed. If it already died between fork and this
  // call, the death signal will never come: leave now.
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != s.launcherPid) ::_exit(127);
  if (s.cpus) ::sched_setaffinity(0, sizeof(cpu_set_t), s.cpus);  // binding is advice: ignore failure
  unblockAllSignalsInChild();
  // cohortrun ignores SIGPIPE; its workers should not. The signals it forwards must act on them even
  // when cohortrun was started with them ignored (an `&` job of a non-interactive shell ignores SIGINT;
  // nohup ignores SIGHUP, which cohortrun then keeps to itself: the workers' own process groups never
  // get a terminal's hangup).
  for (int sig : {SIGPIPE, SIGHUP, SIGINT, SIGTERM, SIGUSR1}) ::signal(sig, SIG_DFL);
  if (::dup2(s.stdinFd, 0) < 0 || ::dup2(s.stdoutFd, 1) < 0 || ::dup2(s.stderrFd, 2) < 0) {
    int err = errno;
    (void)!::write(s.execErrorFd, &err, sizeof err);
    ::_exit(127);
  }
  ::execvpe(s.argv[0], s.argv, s.envp);
  int err = errno;
  (void)!::write(s.execErrorFd, &err, sizeof err);
  ::_exit(127);
}

// Waits for the child's exec: end of file on the close-on-exec pipe means it happened; an int on it
// is the errno of the failure. Returns 0 on success.
int awaitExec(int execErrorFd, std::chrono::milliseconds timeout, const std::string& program) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      COHORT_THROW(Error) << "worker '" << program << "' did not exec within " << timeout.count() << " ms";
    }
    pollfd p{execErrorFd, POLLIN, 0};
    int ready = ::poll(&p, 1, static_cast<int>(left.count()));
    if (ready < 0 && errno != EINTR) COHORT_THROW(Error) << "poll: " << std::strerror(errno);
    if (ready <= 0) continue;
    int err = 0;
    ssize_t n = ::read(execErrorFd, &err, sizeof err);
    if (n < 0 && errno == EINTR) continue;
    return n == static_cast<ssize_t>(sizeof err) ? err : 0;
  }
}

ExitStatus decode(int status) {
  ExitStatus s;
  if (WIFEXITED(status)) s.code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) s.signal = WTERMSIG(status);
  return s;
}

}  // namespace

std::vector<char*> toCStrings(const std::vector<std::string>& strings) {
  std::vector<char*> out;
  for (const std::string& s : strings) out.push_back(const_cast<char*>(s.c_str()));
  out.push_back(nullptr);
  return out;
}

std::string ExitStatus::describe() const {
  if (signal != 0) return "terminated by signal " + std::to_string(signal) + " (" + signalName(signal) + ")";
  return "exited with code " + std::to_string(code);
}

std::unique_ptr<WorkerProcess> WorkerProcess::spawn(const SpawnOptions& options) {
  COHORT_CHECK(!options.argv.empty());
  std::vector<char*> argv = toCStrings(options.argv);
  std::vector<char*> envp = toCStrings(options.environment);
  Pipe out = makePipe(), err = makePipe(), execError = makePipe();
  runtime::UniqueFd devNull(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  if (!devNull) COHORT_THROW(Error) << "cannot open /dev/null: " << std::strerror(errno);
  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  for (int c : options.cpus) CPU_SET(c, &cpus);
  const ChildSetup setup{::getpid(),  devNull.get(), out.write.get(), err.write.get(), execError.write.get(),
                         argv.data(), envp.data(), options.cpus.empty() ? nullptr : &cpus};
  const pid_t pid = ::fork();
  if (pid < 0) COHORT_THROW(Error) << "fork: " << std::strerror(errno);
  if (pid == 0) runChild(setup);
  ::setpgid(pid, pid);  // also in the parent, so the group exists before any signal is forwarded
  out.write.reset();
  err.write.reset();
  execError.write.reset();
  ::fcntl(out.read.get(), F_SETFL, O_NONBLOCK);
  ::fcntl(err.read.get(), F_SETFL, O_NONBLOCK);
  // Owned from here: any throw below kills and reaps the child.
  std::unique_ptr<WorkerProcess> worker(new WorkerProcess(options.rank, pid, std::move(out.read), std::move(err.read)));
  if (int e = awaitExec(execError.read.get(), options.execTimeout, options.argv[0])) {
    worker->reapBlocking();
    COHORT_THROW(InvalidArgument) << "cannot execute '" << options.argv[0] << "': " << std::strerror(e);
  }
  return worker;
}

WorkerProcess::WorkerProcess(int rank, pid_t pid, runtime::UniqueFd stdoutPipe, runtime::UniqueFd stderrPipe)
    : rank_(rank), pid_(pid), stdout_(std::move(stdoutPipe)), stderr_(std::move(stderrPipe)) {}

WorkerProcess::~WorkerProcess() {
  if (reaped()) return;
  signal(SIGKILL);
  ::kill(pid_, SIGKILL);  // in case it left its process group
  reapBlocking();
}

void WorkerProcess::signal(int signal) {
  if (reaped()) return;
  // The worker is its group's leader; until it is reaped (a zombie included) the group id cannot be
  // reused, so this never reaches a stranger.
  if (::kill(-pid_, signal) != 0) ::kill(pid_, signal);
}

bool WorkerProcess::tryReap() {
  if (reaped()) return false;
  siginfo_t info{};
  // WNOWAIT: look without reaping, so the group id stays reserved while the leftovers are killed.
  if (::waitid(P_PID, static_cast<id_t>(pid_), &info, WEXITED | WNOHANG | WNOWAIT) != 0 || info.si_pid == 0) {
    return false;
  }
  ::kill(-pid_, SIGKILL);
  reapBlocking();
  return true;
}

void WorkerProcess::reapBlocking() {
  // Only called for a child that has exited or was just SIGKILLed, so this returns promptly.
  int status = 0;
  pid_t r;
  do {
    r = ::waitpid(pid_, &status, 0);
  } while (r < 0 && errno == EINTR);
  status_ = r == pid_ ? decode(status) : ExitStatus{.code = 1};
}

}  // namespace cohort::launcher
